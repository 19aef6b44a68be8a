"""The one error type for bad user input.

Its message is a single line that names the file or record at fault and says how to fix it;
`run_qa.py` prints it as `error: <message>` and exits with status 2.
"""


class InputError(Exception):
    def __init__(self, where: str, problem: str, fix: str):
        self.where, self.problem, self.fix = where, problem, fix
        super().__init__(f"{where}: {problem}. Fix: {fix}")
