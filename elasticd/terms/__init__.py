"""What every layer shares: node and job ids (``ids``), the job spec (``spec``) and its head
(``head``), job states and failures (``state``), what a client shares (``options``).

Nothing is imported here, and these modules import nothing of ``elasticd`` but the base (errors,
logging) and typed decoding: the layers above read them without loading each other."""
