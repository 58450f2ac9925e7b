"""Every MPI message tag hvd_dcasgd uses, in one table.

Point-to-point messages outside the push protocol (which runs over RMA
windows, :mod:`.channel`) are tagged here, so no two meanings share a tag.
"""

from __future__ import annotations

#: A worker's request to the server outside the push protocol (:class:`.messages.ControlRequests`).
CONTROL = 7301
#: A rank exiting before the session started tells the others (:func:`.exits.announce_departure`).
DEPARTURE = 7302
#: The survivors' communicator after a worker was dropped (``Create_group``'s tag).
SURVIVORS = 7303
#: Several servers (:mod:`.cuts`): the first orders a cut, ends the exchange,
#: is asked to stop by another, orders a drop.
CUT, END, STOP, DROP = 7311, 7312, 7313, 7314
