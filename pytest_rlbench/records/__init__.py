"""What a run or a baseline is, as data: the record format (``record``, validated by ``typed_json``), the
metric ids a record holds (``metrics``), stored baselines (``baselines``), the workload a record
carries (``workload_format``, ``workload``, ``length_shapes``) and how it is replayed per GPU
(``workload_replay``), and how files are written (``files``). No pytest, no torch.
"""
