"""The broker process, in parts: a routing core under the asyncio runtime (:mod:`.server`,
:mod:`.overlays`), client sessions (:mod:`.sessions`), the publish ledger (:mod:`.ledger`),
subscription queues (:mod:`.queues`), advertisements (:mod:`.adverts`), spaces
(:mod:`.spaces`), the ring log (:mod:`.ringlog`) and the SQLite store (:mod:`.store`)."""
