"""Pure policy about other peers: who is admitted, who is banned, what they claim and what we believe.

- ``verdicts``      a peer's claims about its state (epoch, layout, round position, loss) judged
- ``peergate``      bans with expiry, offence counters, fork-shared so every process sees them
- ``admission``     an owned run's admitted peers, one answer for every process
- ``pace``          a DiLoCo round's pace from the rates peers claim, bounded
- ``evidence``      what we know of peers from sources one stranger cannot forge alone
- ``swarm_view``    the swarm's totals from a set of checked records
- ``credit``        the samples this node contributed, settled epoch by epoch
- ``vouching``      credit a stranger cannot mint: what rounds and trusted peers vouch for
- ``swarm_credit``  the swarm's credit and coverage, every claim bounded

No torch, no hivemind, no network: every rule is tested with plain values.
"""
