"""`python -m kerasdist COMMAND`: the `kerasdist` command (`kerasdist_cli`), after the package's import."""

import sys

from kerasdist_cli import main

if __name__ == "__main__":
    sys.exit(main())
