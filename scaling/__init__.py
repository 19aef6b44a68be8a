"""The scaling study's arithmetic, apart from the training run: the communication model
(scaling.model) and the 1-GPU baseline it starts from (scaling.baseline), for
tools/scaling_predict.py and tools/scaling_report.py. It uses qa (the runtime); qa never uses it.
"""
