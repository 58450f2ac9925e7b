"""A server's place among the job's servers: what differs with their number
is asked of it, and the exits' rank names come from it."""

import pytest

from hvd_dcasgd.runtime.exits import rank_name
from hvd_dcasgd.runtime.place import OneOfServers, OnlyServer, place_of


def test_one_server_is_the_only_server_and_several_are_each_one_of_them():
    assert place_of(0, 1) == OnlyServer()
    assert place_of(2, 3, offset=40, numel=20) == OneOfServers(2, 3, 40, 20)


@pytest.mark.parametrize("world_rank, servers, name", [
    (0, 1, "rank 0 (the server)"),
    (1, 1, "rank 1 (worker 0)"),
    (4, 1, "rank 4 (worker 3)"),
    (0, 2, "rank 0 (server 0)"),
    (1, 2, "rank 1 (server 1)"),
    (2, 2, "rank 2 (worker 0)"),
    (5, 3, "rank 5 (worker 2)"),
])
def test_a_fatal_sentence_names_the_rank_by_its_role(world_rank, servers, name):
    assert rank_name(world_rank, servers) == name


def test_each_place_has_its_own_folders_and_trace_tags():
    only, second = place_of(0, 1), place_of(1, 2, offset=8, numel=8)
    assert (only.metrics_folder, only.checkpoint_folder, only.trace_tag(), only.trace_header()) == (
        "server", None, {}, None)
    assert (second.metrics_folder, second.checkpoint_folder, second.trace_tag(), second.trace_header()) == (
        "server-1", "server-1-of-2", {"shard": 1}, {"shard": 1, "offset": 8, "numel": 8})
    assert (only.first_worker_rank, second.first_worker_rank) == (1, 2)
    assert (only.short_name, second.short_name) == ("server", "s1")
    assert only.speaks_for_all and not second.speaks_for_all
