"""``python -m iolstream``: the same as the ``iolstream`` command."""

import sys

from iolstream.tools.cli import main

sys.exit(main())
