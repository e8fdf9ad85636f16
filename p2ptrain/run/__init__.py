"""Owned runs: the owner's key, the signed manifest, invites and updates; no network here.

- ``owner``           the owner's Ed25519 key: created, kept 0600, signing and verifying
- ``manifest``        what every peer of a run shares, in one canonical signed form
- ``manifest_store``  the newest version a node has accepted, in its state directory
- ``updates``         what changed between two versions and whether a running node may apply it
- ``invite``          owner-signed tokens admitting one peer ID until an expiry
- ``runconfig``       how the manifest and a node's own config combine
- ``layout``          the files of a run's directory

May import: :mod:`p2ptrain.config`, :mod:`p2ptrain.trust`, cryptography; never torch or hivemind.
"""
