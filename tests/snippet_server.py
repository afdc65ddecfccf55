"""Runs scripts in processes forked from one interpreter that has imported torch, transformers, Llama and the package.

The docs' snippets each need a fresh process (their own namespace, patches and cwd), but importing torch and
transformers is most of a small snippet's time; a fork starts from those imports. Protocol: one JSON line per
script on stdin (``{"script": path, "cwd": dir, "timeout": s}``), one JSON line back per script (``{"rc": n}``);
the script's stdout and stderr go to ``stdout.txt`` and ``stderr.txt`` in its cwd.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import signal
import sys
import traceback

import torch  # noqa: F401  (the imports every snippet would pay for)
import transformers  # noqa: F401
import transformers.models.llama.modeling_llama  # noqa: F401  (most snippets build a tiny Llama: 2 s of imports)

import liger_registry  # noqa: F401
import liger_registry.kernels  # noqa: F401
import liger_registry.testing  # noqa: F401


def _child(script: str, cwd: str, timeout: int) -> None:
    os.chdir(cwd)
    for fd, name in ((1, "stdout.txt"), (2, "stderr.txt")):
        os.dup2(os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    signal.alarm(timeout)
    sys.argv = [script]
    sys.path[0] = os.path.dirname(script)
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()  # as the snippet's own interpreter would at exit (temporary files it registered)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main() -> None:
    for line in sys.stdin:
        job = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(job["script"], job["cwd"], job["timeout"])
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"rc": os.waitstatus_to_exitcode(status)}), flush=True)


if __name__ == "__main__":
    main()
