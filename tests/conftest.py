"""What every test checks besides its own assertions: each InputError it provokes reads as one line of at most
ERROR_LINE_LIMIT characters as printed (`error: ...`), the length docs/running.md promises. A path under the tests'
temporary folder counts as a short one ("runs"): a user's own long paths are theirs, the rest of the line is ours."""
import re

import pytest

from qa.errors import InputError

ERROR_LINE_LIMIT = 300


@pytest.fixture(autouse=True)
def error_lines_stay_short(monkeypatch, tmp_path_factory):
    made = []
    init = InputError.__init__

    def recorded(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(f"error: {self}")

    monkeypatch.setattr(InputError, "__init__", recorded)
    yield
    temporary = re.compile(re.escape(str(tmp_path_factory.getbasetemp())) + r"/[^/\s'\"]+")
    long = [line for line in made if "\n" in line or len(temporary.sub("runs", line)) > ERROR_LINE_LIMIT]
    if long:
        pytest.fail(f"error lines over {ERROR_LINE_LIMIT} characters (test paths as 'runs'), or of several lines: "
                    + " | ".join(f"{len(temporary.sub('runs', line))}: {line}" for line in long), pytrace=False)
