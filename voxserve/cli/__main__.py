"""`python -m voxserve.cli`, the same as `python -m voxserve`."""

import sys

from voxserve.cli.app import main

sys.exit(main())
