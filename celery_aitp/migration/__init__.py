"""Migration stages at run time: switch, report, guard and roll back (issue: migration stages).

``control`` changes the stage in the shared store (audited) and rolls back without loss;
``analysis`` and ``waitmodel`` turn observation records into per-arm metrics, prediction
error and a modelled wait; ``guard`` steps the split through percentages while the
routed arm passes its conditions and rolls back when it does not.
"""
