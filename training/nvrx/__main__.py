"""`python -m training.nvrx ...`: the adapter's command line (`training.nvrx.adapter.main`), under the name
the batch scripts call."""

import logging

from training.nvrx.adapter import main

logging.basicConfig(level=logging.INFO)
raise SystemExit(main())
