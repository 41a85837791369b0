"""experiments.lib.common.skip_exit_collections: the heap frozen for the interpreter's exit, and what exit must still
do done (atexit handlers, weakref.finalize callbacks, the exit status); evaluate's command calls it after its work."""

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXITING = textwrap.dedent("""
    import atexit, gc, pathlib, sys, weakref
    from experiments.lib import common
    out = pathlib.Path(sys.argv[1])
    class Pool:
      pass
    pool = Pool()
    pool.self = pool  # a cycle: only a collection would free it
    weakref.finalize(pool, lambda: (out.parent / 'finalized').write_text('yes'))
    atexit.register(lambda: out.write_text(str(gc.get_freeze_count() > 0)))
    del pool
    common.skip_exit_collections()
    print('done')
""")


def test_exit_keeps_atexit_handlers_finalizers_and_status(tmp_path):
  job = subprocess.run(
    [sys.executable, '-c', EXITING, str(tmp_path / 'frozen')],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=120,
    check=False,
  )
  assert job.returncode == 0, job.stderr
  assert job.stdout == 'done\n'
  assert (tmp_path / 'frozen').read_text() == 'True'  # frozen when the atexit handlers ran
  assert (tmp_path / 'finalized').read_text() == 'yes'  # weakref.finalize(atexit=True) ran although never collected


def test_evaluate_freezes_only_after_its_command_returned():
  tree = ast.parse((ROOT / 'experiments' / 'evaluate.py').read_text(encoding='utf-8'))
  block = [n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "__name__ == '__main__'"]
  assert len(block) == 1
  assert [ast.unparse(s) for s in block[0].body] == ['main()', 'common.skip_exit_collections()']
