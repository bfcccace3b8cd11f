"""Jobs that the beat and operators run to keep the ledger right: the audit, retention
(pruning) and replaying dead letters."""
