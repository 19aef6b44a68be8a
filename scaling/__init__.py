"""The scaling study, apart from the training run: the communication model (scaling.model), the
1-GPU baseline it starts from (scaling.baseline), the NCCL-tests bandwidths (scaling.bandwidth) and
a run's measured communication (scaling.comm_measure, which run_qa.py adds only when asked:
--measure_communication true). It uses qa (the runtime); qa never uses it.
"""
