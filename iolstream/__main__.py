"""``python -m iolstream``: the same as the ``iolstream`` command."""

import sys

from .cli import main

sys.exit(main())
