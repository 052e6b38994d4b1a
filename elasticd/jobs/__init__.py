"""One job on this node: running its workers (``launch``, ``launcher``), their log tree and stacks
files, and the job rules above the store (admission, queue, quota, view). The job's terms (its
spec, head and states) are ``elasticd.terms``, below every layer that reads them."""
