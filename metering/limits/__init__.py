"""Limit administration: storing limits (`service`), reading limits and entitlements files
(`files`), and the producer's check of limit names (`names`). Imports nothing, so a
producer that imports `names` loads no database."""
