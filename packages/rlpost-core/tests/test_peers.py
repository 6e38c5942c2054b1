"""Mutual RL's sharing decision (catalog 001-11): what a peer's response becomes."""

from __future__ import annotations

import pytest
import torch

from rlpost.core.peers import BASELINE, DROP, TRAIN, PeerSharing, peer_roles

# the policy's own responses: group 0 has a verified success, group 1 has none
OWN_G = torch.tensor([0, 0, 1, 1])
OWN_OK = torch.tensor([1.0, 0.0, 0.0, 0.0])
# peer responses: to group 0 (right, wrong), group 1 (right, wrong), an unshared prompt
PEER_G = torch.tensor([0, 0, 1, 1, -1])
PEER_OK = torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0])


def test_sgt_transfers_only_verified_successes_on_the_rescue_set():
    roles = peer_roles(PeerSharing("rescue"), OWN_G, OWN_OK, PEER_G, PEER_OK)
    # group 0 is solved by the policy itself: nothing crosses over; in group 1 only the
    # verified success does; a prompt the policy did not answer never does
    assert roles.tolist() == [DROP, DROP, TRAIN, DROP, DROP]
    # no verified success anywhere: nothing is transferred, whatever the groups
    none = peer_roles(PeerSharing("rescue"), OWN_G, OWN_OK * 0, PEER_G, PEER_OK * 0)
    assert (none == DROP).all()


def test_prp_pools_and_xgrpo_shares_the_baseline_of_every_shared_prompt():
    prp = peer_roles(PeerSharing("pool"), OWN_G, OWN_OK, PEER_G, PEER_OK)
    assert prp.tolist() == [TRAIN, TRAIN, TRAIN, TRAIN, DROP]
    x = peer_roles(PeerSharing("baseline"), OWN_G, OWN_OK, PEER_G, PEER_OK)
    assert x.tolist() == [BASELINE, BASELINE, BASELINE, BASELINE, DROP]


def test_max_per_group_caps_the_peers_in_a_group():
    roles = peer_roles(PeerSharing("pool", max_per_group=1), OWN_G, OWN_OK, PEER_G, PEER_OK)
    assert roles.tolist() == [TRAIN, DROP, TRAIN, DROP, DROP]


def test_bad_sharing_is_refused():
    with pytest.raises(ValueError, match="mode must be one of"):
        PeerSharing("everything")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_per_group"):
        PeerSharing("pool", max_per_group=0)
