"""Publishing the open lab: a static site of the experiments a visibility policy selects (docs/publish.md).

`policy.py` reads `publish.toml`; `redact.py` removes what must not be published; `public.py` is the
read-only public mode shared by `marin dashboard --public` and the site builder (which experiments are
visible, which URLs may be served); `site.py` renders the pages through the dashboard's own templates and
writes them with relative links; `cli.py` is `marin publish`.
"""

from marin.publish.policy import Policy, PolicyError, load_policy
from marin.publish.redact import Redactor

__all__ = ["Policy", "PolicyError", "Redactor", "load_policy"]
