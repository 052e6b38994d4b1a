"""This node's part in one job: a pure step function (``step``) and the executor that runs it."""
