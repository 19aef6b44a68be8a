"""Components of the SQuAD fine-tuning pipeline; `run_qa.py` wires them together."""
