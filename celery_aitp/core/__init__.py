"""What the publisher, the worker side and the replay all speak: the request a publish
becomes, the decision made for it and its header codec (``request``), the snapshot the
stages decide on (``view``), and the running task's own header (``running``). It imports
none of ``publish``, ``worker``, ``predict`` or ``middleware``, so they never import each
other in a circle through it."""
