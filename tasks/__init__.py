"""Task suites: math and multi-hop QA sources behind one protocol (:mod:`.base`)."""
