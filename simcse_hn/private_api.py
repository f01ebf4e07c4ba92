"""Every private member of another library that simcse-hn relies on, in one place, each with its reason (no public
hook serves) and whether a release without it would train or load wrongly (`essential`) or only differ in speed or
presentation.

`problems(owner, members)` says what an installed release lacks of them: SimCSETrainer refuses to start without an
essential Trainer method (training.trainer_internals); tests/test_trainer_hooks.py runs the checks on every CI run,
and tests/test_architecture.py fails on a private member of another library that the package uses but this list
does not name.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class PrivateMember:
    """`owner.name`, a private member of another library (`owner`: its import path, e.g. "transformers.Trainer";
    with "()" an instance of it, for an attribute each instance sets; `instance`, for one whose class takes
    arguments, makes one): simcse-hn `overrides` it (a method of a subclass), `calls` it or `reads` it (an attribute,
    through getattr too); `parameters`, those after `self` it is overridden or called with (checked against the
    installed release; None: not checked)."""

    owner: str
    name: str
    parameters: tuple[str, ...] | None
    why: str
    essential: bool = True
    use: str = "overrides"
    # an instance attribute (set in __init__, absent from the class): how to make one that has it, for the check
    instance: Callable[[], object] | None = None


PRIVATE_TRAINER_OVERRIDES = (
    PrivateMember("transformers.Trainer", "_get_grad_norm", ("model", "grad_norm"), "the step's total gradient "
                  "norm, which the Trainer computes anyway for clipping and logging, goes to the non-finite guard: a "
                  "finite norm spares it a pass over every gradient. No callback receives the norm.", essential=False),
    PrivateMember("transformers.Trainer", "_load_from_checkpoint", ("resume_from_checkpoint", "model"), "a resume "
                  "loads the saved folder's own files (encoder in transformers format, head, loss state: "
                  "SimCSEModel.load_weights). SimCSEModel is no PreTrainedModel: the Trainer's loader, non-strict, "
                  "would match none of its keys and load nothing. A sharded model goes to the Trainer's loader."),
    PrivateMember("transformers.Trainer", "_load_best_model", (), "load_best_model_at_end, for the same reason as "
                  "_load_from_checkpoint."),
)  # fmt: skip

PRIVATE_PARSER_MEMBERS = (
    PrivateMember("transformers.HfArgumentParser", "_add_dataclass_arguments", ("dtype",), "--help lists "
                  "simcse-hn's own flags first, by group, and gives some Trainer flags their simcse-hn meaning "
                  "(configuration.parser); HfArgumentParser has no public hook per field. Without it --help lists the "
                  "flags in one group, with the Trainer's own help.", essential=False),
    PrivateMember("transformers.HfArgumentParser", "_parse_dataclass_field", ("parser", "field"), "one field as "
                  "HfArgumentParser makes its flag (types, choices, booleans), added to the group the override above "
                  "chose.", use="calls"),
)  # fmt: skip

OTHER_PRIVATE_MEMBERS = (
    PrivateMember("torch", "_foreach_lerp_", None, "the momentum encoder's update, every parameter in one call "
                  "(training.queue).", use="calls"),
    PrivateMember("torch", "_foreach_norm", None, "the non-finite guard's largest magnitude of every gradient in one "
                  "call (training.callbacks).", use="calls"),
    PrivateMember("atexit", "_run_exitfuncs", None, "a process that ran collectives runs the exit handlers itself "
                  "before os._exit (training.process_exit).", use="calls"),
    PrivateMember("accelerate.state.PartialState", "_prepare_backend", None, "the CPU stand-in for FSDP and "
                  "DeepSpeed runs them on gloo (testing.sharded_cpu; tests only).", essential=False),
    PrivateMember("argparse.ArgumentDefaultsHelpFormatter", "_get_help_string", ("action",), "a built-in "
                  "objective's option flag states its objective's default in its help; argparse would add \"(default: "
                  "None)\" after it, the flag's value when unset (configuration.help_format). argparse documents no "
                  "hook per flag. Without it --help shows both defaults.", essential=False),
    PrivateMember("argparse.ArgumentParser()", "_actions", None, "a parser's flags in its order, which the flag "
                  "tables record (cli.flag_table.describe); argparse lists them nowhere public. Without it the tables "
                  "cannot be rewritten; the command line's front still reads the committed ones.", essential=False,
                  use="reads"),
    PrivateMember("argparse.ArgumentParser()", "_action_groups", None, "the groups --help prints, in order, which "
                  "the flag tables record with the flags (cli.flag_table.describe).", essential=False, use="reads"),
    PrivateMember("mteb.results.TaskResult", "_round_scores", None, "a result file rounded as mteb rounds its own "
                  "(evaluation.mteb_results).", essential=False, use="calls"),
)  # fmt: skip


def _compiled_module() -> object:
    import torch  # noqa: PLC0415 - made only when the check runs

    return torch.compile(torch.nn.Linear(1, 1))


def _dataset() -> object:
    import datasets  # noqa: PLC0415 - made only when the check runs

    return datasets.Dataset.from_dict({"text": ["a"]})


# read through getattr (a string): attributes with no public accessor
PRIVATE_ATTRIBUTES = (
    PrivateMember(
        "torch._dynamo.eval_frame.OptimizedModule",
        "_orig_mod",
        None,
        "the model inside torch.compile's wrapper, which the momentum encoder copies and follows (training.queue."
        "bare_model: accelerate's unwrap_model may keep the wrapper). Without it the copy is of the wrapper.",
        essential=False,
        use="reads",
        instance=_compiled_module,
    ),
    PrivateMember(
        "datasets.Dataset",
        "_fingerprint",
        None,
        "the hash of a Hub dataset as read (provenance.data_sha256, the run's record): datasets' fingerprint of its "
        "content and transforms, which no public attribute gives. Without it such a run cannot record its data and "
        "refuses to start.",
        use="reads",
        instance=_dataset,
    ),
    PrivateMember(
        "transformers.PreTrainedModel",
        "_no_split_modules",
        None,
        "the encoder's layer classes, which SimCSEModel passes on under the same name for accelerate's FSDP "
        "TRANSFORMER_BASED_WRAP (modeling.model). Without it FSDP wraps the model whole.",
        essential=False,
        use="reads",
    ),
    PrivateMember(
        "transformers.PretrainedConfig",
        "_attn_implementation",
        None,
        "the attention function the encoder's layers look up at each call, which a packed training forward points "
        "at its own for the forward's length (modeling.packing.packed) and puts back; set_attn_implementation "
        "checks and reloads where a per-step switch must cost nothing. Without it packing is off (packing.packs) "
        "and length groups run as separate forwards.",
        essential=False,
        use="reads",
    ),
)

PRIVATE_MEMBERS = PRIVATE_TRAINER_OVERRIDES + PRIVATE_PARSER_MEMBERS + OTHER_PRIVATE_MEMBERS + PRIVATE_ATTRIBUTES



def problems(owner: object, members: tuple[PrivateMember, ...]) -> list[tuple[PrivateMember, str]]:
    """What `owner` (a class or module, the installed one or a stand-in) lacks of `members`, one line each: a name
    gone, a method's parameters renamed or reordered."""
    found_problems = []
    shown_owner = getattr(owner, "__name__", str(owner))
    for member in members:
        where = f"{shown_owner}.{member.name}"
        if not hasattr(member.instance() if member.instance is not None else owner, member.name):
            found_problems.append((member, f"{where} is gone ({member.why})"))
            continue
        if member.parameters is None:
            continue
        found = parameters(owner, member.name)
        if found != member.parameters:
            shown = "not a method" if found is None else f"({', '.join(found)})"
            wanted = ", ".join(member.parameters)
            found_problems.append((member, f"{where} is {shown}, simcse-hn {member.use} ({wanted})"))
    return found_problems


def parameters(owner: object, name: str) -> tuple[str, ...] | None:
    """The parameters of `owner.name` after `self` (a static or class method's as it is called), None when it is no
    function."""
    member = getattr(owner, name)
    if not callable(member):
        return None
    names = tuple(inspect.signature(member).parameters)
    bound = isinstance(inspect.getattr_static(owner, name), (staticmethod, classmethod))
    return names if bound or not inspect.isclass(owner) else names[1:]
