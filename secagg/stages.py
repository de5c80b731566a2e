"""The one vocabulary of stage names and message field keys.

Every name a layer's server driver and a node exchange, and every stage a cost-ledger row
or a transcript entry is booked under, is defined here once; the drivers
(:mod:`secagg.layers.plaintext`, :mod:`secagg.secure_sum.remote`,
:mod:`secagg.homomorphic.remote`), the nodes (:mod:`secagg.node` and the layers' node
modules), the Flower records, the costs and the engine import them. As in Flower's
``secaggplus_constants``, the constants are plain ``str`` values: a wire field, a ledger
row and a transcript read exactly as they did when the names were spelled inline.

* :class:`Stage` -- a step a node is asked to run (the instruction's ``step``) and the
  stage a message or a drop is booked under (``dropped:<stage>``: :func:`dropped_stage`).
* :class:`Key` -- the fields of an instruction or a reply (``reply_field(rec, Key.MSG,
  bytes)``).

``tests/test_stage_vocabulary.py`` checks that no stage name is a string literal in
``secagg/`` outside this module.
"""

from __future__ import annotations

from typing import Final


class Stage:
    """Stage and step names (the values are the wire and ledger spelling)."""

    # the runtime's own exchanges
    HELLO: Final = "hello"
    CLOSE: Final = "close"
    EVALUATE: Final = "evaluate"
    #: the server's broadcast of the global model (a ledger row per client)
    BROADCAST: Final = "broadcast"
    #: a client's local work that sends nothing (a ledger row with no bytes)
    LOCAL: Final = "local"
    # Plaintext (and the upload of every layer that sends one message per client)
    UPLOAD: Final = "upload"
    # SecureSum (Bonawitz et al.): five stages, and the next session's advertise ahead
    ADVERTISE: Final = "advertise"
    SHARE: Final = "share"
    MASKED_INPUT: Final = "masked-input"
    CONSISTENCY: Final = "consistency"
    UNMASK: Final = "unmask"
    ADVERTISE_NEXT: Final = "advertise-next"
    # Homomorphic: the node steps, and the stages its messages are booked under
    HE_KEYGEN: Final = "he-keygen"
    HE_UPLOAD: Final = "he-upload"
    HE_DECRYPT: Final = "he-decrypt"
    KEYS: Final = "keys"
    DECRYPT: Final = "decrypt"
    RESULT: Final = "result"
    # ValidatedSum (Prio-style): the proof stage after the shares
    PROOF: Final = "proof"
    CHECK: Final = "check"

    #: the prefix of a drop's ledger stage (``dropped:<stage>``)
    DROPPED_PREFIX: Final = "dropped:"


#: the secure-sum session's stages, in order
SECURE_SUM_STAGES: Final = (Stage.ADVERTISE, Stage.SHARE, Stage.MASKED_INPUT,
                            Stage.CONSISTENCY, Stage.UNMASK)

#: the steps a node can be asked to run (``close``: at the end of the run, the node's
#: signed closing statement, :mod:`secagg.attest`)
STEPS: Final = (Stage.HELLO, Stage.UPLOAD, *SECURE_SUM_STAGES, Stage.ADVERTISE_NEXT,
                Stage.HE_KEYGEN, Stage.HE_UPLOAD, Stage.HE_DECRYPT, Stage.EVALUATE,
                Stage.CLOSE)


def dropped_stage(stage: str) -> str:
    """The ledger stage of a client dropped at ``stage``: ``"dropped:<stage>"``."""
    return f"{Stage.DROPPED_PREFIX}{stage}"


class Key:
    """Field names of an instruction or a reply between a driver and a node."""

    # every instruction
    STEP: Final = "step"
    RUN: Final = "run"
    ROUND: Final = "round"
    ROUNDS: Final = "rounds"
    PHASE: Final = "phase"
    SEED: Final = "seed"
    #: the packed broadcast the client step needs
    BROADCAST: Final = "broadcast"
    #: the DP noise parameters a node part needs
    DP: Final = "dp"
    DP_TERMS: Final = "dp_terms"
    DP_SIZING: Final = "dp_sizing"
    #: the layer's parameters, as JSON
    LAYER: Final = "layer"
    PARAMS: Final = "params"
    N: Final = "n"
    # a protocol message and its costs
    MSG: Final = "msg"
    CPU_S: Final = "cpu_s"
    FLOPS: Final = "flops"
    #: a client step's clip counts, a JSON object
    CLIPPED: Final = "clipped"
    # secure sum
    SESSION: Final = "session"
    WITH_STEP: Final = "with_step"
    STEP_CPU_S: Final = "step_cpu_s"
    ACK: Final = "ack"
    ACK_CPU_S: Final = "ack_cpu_s"
    NEXT_SESSION: Final = "next_session"
    NEXT_ROUND: Final = "next_round"
    NEXT_N: Final = "next_n"
    NEXT_LAYER: Final = "next_layer"
    NEXT_MSG: Final = "next_msg"
    NEXT_CPU_S: Final = "next_cpu_s"
    # homomorphic
    FRAMES: Final = "frames"
    N_PLAN: Final = "n_plan"
    ENC_CPU_S: Final = "enc_cpu_s"
    CONTEXT: Final = "context"
    PACKING: Final = "packing"
    # Flower's node evaluation and attestation
    EVALUATE: Final = "evaluate"
    EVAL_STATE: Final = "eval_state"
    #: the global model a node evaluates on its own (the ``evaluate`` step)
    STATE: Final = "state"
    ACC: Final = "acc"
    HAS_TEST: Final = "has_test"
    ATT: Final = "att"
    ATT_CPU_S: Final = "att_cpu_s"
    LEDGER_HEAD: Final = "ledger_head"
