"""retrace.mpi from Python: a two-rank mesh under mpirun (skipped without MPI)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import retrace


def test_mpi_module_says_whether_it_is_built():
    assert isinstance(retrace.mpi.available, bool)
    if not retrace.mpi.available:
        with pytest.raises(retrace.Unimplemented, match="no MPI"):
            retrace.mpi.open_mesh("cpu")


@pytest.mark.skipif(not retrace.mpi.available or shutil.which("mpirun") is None,
                    reason="this build has no MPI, or mpirun is not installed")
def test_two_ranks_distribute_reduce_and_replay():
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1")
    worker = Path(__file__).with_name("mpi_worker.py")
    done = subprocess.run(["mpirun", "-np", "2", "--bind-to", "none", sys.executable, str(worker)],
                          env=env, capture_output=True, text=True, timeout=240)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "rank 0 of 2: ok" in out and "rank 1 of 2: ok" in out, out
