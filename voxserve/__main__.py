"""`python -m voxserve` runs the same command line as the `voxserve` script."""

import sys

from voxserve.cli import main

sys.exit(main())
