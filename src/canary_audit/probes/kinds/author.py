"""Paper A's probes: the author canaries after their head (decoded under
every arm, and teacher-forced under every prefill arm with the non-member
authors beside them), per-author QA and the retain set.  Their tables are
the built-in ones of views/catalog.py (paper A's part)."""

from functools import partial

from canary_audit.probes.items import author_decode, canary_scored
from canary_audit.probes.kinds import ProbeKind
from canary_audit.records import AUTHOR_NONMEMBER, PROBE_SETS

CANARY, QA, RETAIN = PROBE_SETS["author"]
KINDS = (
    ProbeKind(CANARY, "author", decode=partial(author_decode, probe_set=CANARY), scored=canary_scored,
              record_sets=(CANARY, AUTHOR_NONMEMBER), batch="author"),
    ProbeKind(QA, "author", decode=partial(author_decode, probe_set=QA), batch="author"),
    ProbeKind(RETAIN, "author", decode=partial(author_decode, probe_set=RETAIN), batch="author"),
)
