"""Paper B's probes: the hex canaries behind their preamble (greedy with
hit@k samples, and teacher-forced with their decoys, the non-member records
and the exposure candidates).  Their tables are the built-in ones of
views/catalog.py (the hex, exposure, strata and bSFT parts)."""

from canary_audit.probes.items import hex_decode, hex_scored
from canary_audit.probes.kinds import ProbeKind
from canary_audit.records import CANDIDATE, HEX_SETS, NONMEMBER

KINDS = (
    ProbeKind("hex", "hex", decode=hex_decode, scored=hex_scored, record_sets=(*HEX_SETS, NONMEMBER, CANDIDATE),
              budget="hex_max_new_tokens", sampled=True),
)
