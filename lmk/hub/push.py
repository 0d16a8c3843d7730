"""Upload a folder to a Hugging Face model repo: create the repo (public or private), the branch when one is named,
and commit the folder in one commit.

The token is the hub's own: `HF_TOKEN`, else the one `hf auth login` stored (`huggingface_hub.get_token`). The
endpoint is `HF_ENDPOINT` (the hub by default; tests point it at their stand-in on 127.0.0.1).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import HfApi, constants, get_token
from huggingface_hub.errors import HfHubHTTPError

from lmk.config import UserError


class PushError(UserError, RuntimeError):
    """A push that cannot start (no token, offline mode, a bad repo id)."""


@dataclass
class Pushed:
    repo_id: str
    revision: str
    commit: str  # the commit's sha
    url: str  # the commit's page


def check_push(repo_id: str, verify: bool = False) -> str:
    """The token a push to `repo_id` would use; PushError naming the fix when a push cannot start. `verify`: ask
    the hub who the token is (HfApi.whoami) first, so a wrong token fails before any model loads or file is sent."""
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(parts):
        raise PushError(f"--push-to-hub {repo_id!r} is not a repo id; give <user or org>/<name>, e.g. me/lmk-fixed-32")
    if constants.HF_HUB_OFFLINE:
        raise PushError("HF_HUB_OFFLINE is set, so nothing can be uploaded; unset it (HF_HUB_OFFLINE=0) to push")
    token = get_token()
    if not token:
        raise PushError("pushing to the hub needs a write token; set HF_TOKEN=<token> (a write token from "
                        "https://huggingface.co/settings/tokens) or run `hf auth login`")
    if verify:
        try:
            HfApi(token=token).whoami()
        except HfHubHTTPError as err:
            status = err.response.status_code if err.response is not None else "?"
            raise PushError(f"the hub at {constants.ENDPOINT} refused the token (HTTP {status}); set HF_TOKEN to a valid "
                            "write token (https://huggingface.co/settings/tokens) or run `hf auth login`") from None
        except OSError as err:  # no connection: nothing was sent
            raise PushError(f"the hub at {constants.ENDPOINT} cannot be reached ({type(err).__name__}); check the "
                            "network or HF_ENDPOINT, then push again") from None
    return token


def push_folder(folder: str | os.PathLike, repo_id: str, *, private: bool = False, revision: str | None = None,
                message: str = "Upload an LMK model (lmk)") -> Pushed:
    """Create `repo_id` if needed (private when asked; an existing repo keeps its visibility), the branch
    `revision` if it is not main, and commit `folder` to it."""
    token = check_push(repo_id)
    api = HfApi(token=token)
    api.create_repo(repo_id, private=private, exist_ok=True)
    branch = revision or constants.DEFAULT_REVISION
    if branch != constants.DEFAULT_REVISION:
        api.create_branch(repo_id, branch=branch, exist_ok=True)
    info = api.upload_folder(repo_id=repo_id, folder_path=str(Path(folder)), revision=branch, commit_message=message)
    return Pushed(repo_id=repo_id, revision=branch, commit=info.oid, url=info.commit_url)
