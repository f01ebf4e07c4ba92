"""The Hub transfer of a saved folder, through `huggingface_hub`: create the repo, upload exactly the files the save
wrote (the folder's manifest, an allow-list), update the STS results of a pushed model. Every failure is one line
(`HubError`); local files are never touched by a push."""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass, field

from huggingface_hub import CommitOperationAdd, HfApi, constants, get_token
from huggingface_hub.errors import (
    HfHubHTTPError,
    LocalEntryNotFoundError,  # hf_hub_download's "could not reach the Hub"
    OfflineModeIsEnabled,
)
from transformers import TrainerCallback

from simcse_hn.export.model_card import model_card, update_card_sts
from simcse_hn.files import CARD, MANIFEST, SIMCSE_CONFIG, STS_RESULTS, read_json, recorded_files
from simcse_hn.training.checkpoints import manifest_problem

logger = logging.getLogger(__name__)


class HubError(RuntimeError):
    """The Hub could not be reached or refused the upload; the message is one line. Local files are untouched."""


def find_token(token: str | None = None) -> str | None:
    """The explicit token, else HF_TOKEN, else the one saved by `hf auth login`."""
    return token or get_token()


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def _transport_errors() -> tuple[type[BaseException], ...]:
    """Connection-level errors: the HTTP client's base error (httpx2 under huggingface_hub 2.x, httpx under 1.x)."""
    errors: list[type[BaseException]] = [ConnectionError, TimeoutError, LocalEntryNotFoundError]
    for name in ("httpx2", "httpx"):
        with contextlib.suppress(ImportError):
            errors.append(importlib.import_module(name).HTTPError)
    return tuple(errors)


@contextlib.contextmanager
def _hub_errors(action: str):
    """Turn what huggingface_hub raises (HTTP status, connection, offline mode, bad metadata) into a HubError."""
    try:
        yield
    except OfflineModeIsEnabled:
        raise HubError(f"{action}: offline mode is on (HF_HUB_OFFLINE=1); unset it to reach the Hub") from None
    except HfHubHTTPError as e:
        status = e.response.status_code if e.response is not None else "?"
        hint = " (check the token's write access)" if status in (401, 403) else ""
        raise HubError(f"{action}: HTTP {status}{hint}: {_first_line(e)}") from None
    except _transport_errors() as e:
        raise HubError(f"{action}: cannot reach {constants.ENDPOINT} ({_first_line(e)})") from None
    except ValueError as e:  # e.g. README metadata rejected by /api/validate-yaml
        raise HubError(f"{action}: {_first_line(e)}") from None


def _require_token(token: str | None, action: str) -> str:
    token = find_token(token)
    if token is None:
        raise HubError(f"{action}: no Hugging Face token; run `hf auth login` or set HF_TOKEN")
    return token


@dataclass(frozen=True)
class HubTarget:
    """Where a training run pushes: the repo, the token (never printed: repr=False), visibility, branch, strategy."""

    repo_id: str
    token: str | None = field(default=None, repr=False)
    private: bool | None = None
    revision: str | None = None
    strategy: str = "end"

    @classmethod
    def from_args(cls, args) -> HubTarget:
        strategy = getattr(args.hub_strategy, "value", args.hub_strategy)
        return cls(args.hub_model_id, args.hub_token, args.hub_private_repo, args.hub_revision, str(strategy))


def push_to_hub(output_dir: str, target: HubTarget, commit_message: str = "Upload SimCSE sentence encoder") -> str:
    """Create the repo (and branch) if needed and upload, in one commit, exactly the files that the folder's last save
    recorded in its manifest (never checkpoints, logs, pickled arguments or anything else in the folder); returns the
    commit URL. Raises HubError (one line) without credentials, network or permission."""
    action = f"push {output_dir} to {target.repo_id}"
    files = recorded_files(output_dir)
    if files is None or SIMCSE_CONFIG not in files:
        raise HubError(f"{action}: not a model folder saved by simcse-hn (no {MANIFEST} listing {SIMCSE_CONFIG})")
    api = HfApi(token=_require_token(target.token, action))
    operations = [CommitOperationAdd(name, os.path.join(output_dir, name)) for name in files]
    with _hub_errors(action):
        repo = api.create_repo(target.repo_id, private=target.private, exist_ok=True)
        if target.revision is not None:
            api.create_branch(repo.repo_id, branch=target.revision, exist_ok=True)
        info = api.create_commit(repo.repo_id, operations, commit_message=commit_message, revision=target.revision)
    logger.info("pushed %d files of %s to %s", len(files), output_dir, info.commit_url)
    return info.commit_url


class CheckpointPush(TrainerCallback):
    """`hub_strategy: every_save`: after each checkpoint is written whole (its manifest written last: register this
    callback after training.checkpoints.CheckpointCommit), push its model files (its manifest) to the repo, so a
    long run can be followed on the Hub; the finished folder is pushed at the end as always. A checkpoint that is not
    whole is not pushed; a failed push is a warning here (training goes on); the final push reports its own error."""

    def __init__(self, target: HubTarget):
        self.target = target

    def on_save(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        problem = manifest_problem(folder, verify_hashes=False)
        if problem is not None:
            logger.warning("%s is not pushed: %s", folder, problem)
            return
        try:
            push_to_hub(folder, self.target, commit_message=f"Checkpoint at step {state.global_step}")
        except HubError as e:
            logger.warning("checkpoint push failed (training goes on): %s", e)


def push_sts_results(repo_id: str, results: dict, token: str | None = None) -> str:
    """Upload sts_results.json to an existing model repo and update its card's STS table and model-index, in one
    commit; returns the commit URL. A repo without a card gets one built from its simcse_config.json."""
    action = f"push STS results to {repo_id}"
    api = HfApi(token=_require_token(token, action))
    name = repo_id.split("/")[-1]
    with _hub_errors(action), tempfile.TemporaryDirectory() as cache:
        files = {sibling.rfilename for sibling in api.model_info(repo_id).siblings or []}
        if CARD in files:
            with open(api.hf_hub_download(repo_id, CARD, cache_dir=cache), encoding="utf-8") as f:
                content = update_card_sts(f.read(), results, model_name=name)
        else:
            config_path = (
                api.hf_hub_download(repo_id, SIMCSE_CONFIG, cache_dir=cache) if SIMCSE_CONFIG in files else None
            )
            config = (read_json(config_path) if config_path else None) or {}
            content = str(model_card(config, results, model_name=name, model_id=repo_id))
        operations = [
            CommitOperationAdd(STS_RESULTS, (json.dumps(results, indent=2, sort_keys=True) + "\n").encode()),
            CommitOperationAdd(CARD, content.encode()),
        ]
        info = api.create_commit(repo_id, operations, commit_message="Add STS results")
    logger.info("pushed STS results to %s", info.commit_url)
    return info.commit_url
