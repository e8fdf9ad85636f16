"""p2ptrain top: the Textual monitor. Talks to a node over HTTP only; never imports torch or hivemind."""
