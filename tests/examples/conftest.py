"""Make the repository's ``examples`` package importable (the editable install only maps ``agentbolt``)."""

from __future__ import annotations

import sys

from support.servers import REPO

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
