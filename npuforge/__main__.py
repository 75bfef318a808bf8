"""``python -m npuforge`` (and ``torchrun ... -m npuforge zoo train ...``): the ``npuforge`` command."""

import sys

from .cli import main

sys.exit(main())
