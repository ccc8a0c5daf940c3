"""`python -m kerasdist_cli COMMAND`: the `kerasdist` command without importing kerasdist first
(`python -m kerasdist` imports the package, and with it TensorFlow); the Slurm recipe runs
`python -m kerasdist_cli supervise` with the training command's own interpreter."""

import sys

from kerasdist_cli import main

if __name__ == "__main__":
    sys.exit(main())
