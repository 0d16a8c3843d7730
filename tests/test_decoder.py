"""Decoder LLMs as backbones: the layout a decoder gets (BOS, EOS landmarks, a final EOS), the one place where its
inputs differ from an encoder's (positions from the mask, either padding side), last-token pooling, and where the
landmarks go under causal attention (lmk's placement and the authors')."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from lmk.config import ConfigError
from lmk.config.model import EncoderConfig, PoolingConfig
from lmk.model.embedding import EmbeddingModel
from lmk.model.landmark.backbone_inputs import backbone_inputs
from lmk.model.landmark.tokenization import LandmarkTokenizer

CONF = Path(__file__).resolve().parents[1] / "conf"
TEXTS = ["Landmark pooling on a decoder puts an end-of-sequence token after every chunk of the text.",
         "Short one.", "A third text, of a middle length, with some words."]


def enc(name: str, **over) -> dict:
    cfg = {**OmegaConf.to_container(OmegaConf.load(CONF / "encoder" / f"{name}.yaml")), **over}
    if name == "tiny-modernbert":  # smaller still: both attention kinds (16-token windows), seconds to build
        cfg["config_overrides"] = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 2,
                                   "intermediate_size": 96, "global_attn_every_n_layers": 2, "local_attention": 16,
                                   "max_position_embeddings": 512}
        cfg["max_positions"] = 512
    return cfg


def pool(name: str, **over) -> dict:
    return {**OmegaConf.to_container(OmegaConf.load(CONF / "pooling" / f"{name}.yaml")), **over}


@pytest.fixture(scope="module")
def decoder() -> EmbeddingModel:
    return EmbeddingModel.build(enc("tiny-decoder"), pool("lmk-fixed", chunk_size=4), passage_max_length=64)


def test_a_decoder_layout_leads_with_bos_and_ends_every_chunk_with_eos(decoder) -> None:
    hf = decoder.tokenizer
    assert hf.sep_token_id is None and hf.cls_token_id is None  # a Llama-like tokenizer: BOS / EOS only
    lt = decoder.landmark_tokenizer
    assert (lt.cls_id, lt.landmark_id) == (hf.bos_token_id, hf.eos_token_id)
    feats = decoder.tokenize(TEXTS[:1])
    ids, pooled = feats["input_ids"][0], feats["pool_mask"][0]
    assert "token_type_ids" not in feats
    assert ids[0] == hf.bos_token_id and ids[-1] == hf.eos_token_id and pooled[-1]  # a landmark closes the text
    assert torch.equal(ids[pooled], torch.full((int(pooled.sum()),), hf.eos_token_id))
    gaps = torch.diff(torch.nonzero(pooled).flatten())
    assert bool((gaps[:-1] == 5).all())  # 4 content tokens, then the landmark, chunk after chunk

    last = decoder.with_pooling(pool("last-token"))
    f = last.tokenize(TEXTS[:1])
    assert f["input_ids"][0, -1] == hf.eos_token_id and not f["pool_mask"].any()  # <s> text </s>


@pytest.mark.parametrize("name", ["tiny-modernbert", "tiny-decoder"])
def test_either_padding_side_embeds_the_same(name) -> None:
    """Positions come from the attention mask (backbone_inputs), so a left-padded row embeds as when it is alone
    or right-padded: for an encoder and a decoder alike."""
    out = {}
    for side in ("left", "right"):
        model = EmbeddingModel.build(enc(name, padding_side=side), pool("lmk-fixed", chunk_size=4),
                                     passage_max_length=64)
        assert model.tokenizer.padding_side == side
        feats = model.tokenize(TEXTS)
        mask = feats["attention_mask"]
        assert bool((mask[:, 0] == 0).any()) == (side == "left")  # the batch really is padded on that side
        out[side] = model.encode(TEXTS, batch_size=len(TEXTS))
        alone = np.stack([model.encode([t])[0] for t in TEXTS])
        np.testing.assert_allclose(out[side], alone, atol=1e-5)
    np.testing.assert_allclose(out["left"], out["right"], atol=1e-5)


def test_positions_follow_the_mask_and_right_padding_keeps_the_backbones_own(decoder) -> None:
    feats = decoder.tokenize(TEXTS)  # left-padded (the decoder's config)
    inputs = backbone_inputs(decoder.backbone, feats)
    assert set(inputs) == {"input_ids", "attention_mask", "position_ids"}
    mask = feats["attention_mask"].bool()
    for row in range(len(TEXTS)):
        assert torch.equal(inputs["position_ids"][row][mask[row]], torch.arange(int(mask[row].sum())))
    # an encoder, right-padded: its real tokens embed bit for bit as without position ids
    model = EmbeddingModel.build(enc("tiny-modernbert"), pool("mean"), passage_max_length=64)
    feats = model.tokenize(TEXTS)
    with torch.no_grad():
        own = model.backbone(input_ids=feats["input_ids"], attention_mask=feats["attention_mask"]).last_hidden_state
        ours = model.token_embeddings(feats)
    keep = feats["attention_mask"].bool()
    assert torch.equal(own[keep], ours[keep])


def test_last_token_pooling_reads_the_closing_eos_on_either_side() -> None:
    hidden = torch.arange(2 * 4 * 1, dtype=torch.float32).reshape(2, 4, 1) + 1
    from lmk.model.landmark import build_pooler

    pooler = build_pooler("last_token")
    right = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    left = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    raw = pooler.pool(hidden, right.bool(), None)
    assert raw[:, 0].tolist() == [2.0, 8.0]
    assert pooler.pool(hidden, left.bool(), None)[:, 0].tolist() == [4.0, 8.0]


# ------------------------------------------------------------------------------------------------- placement
def test_the_authors_placement_puts_the_landmark_before_each_chunk(decoder) -> None:
    hf = decoder.tokenizer
    ours = LandmarkTokenizer(hf, strategy="fixed", chunk_size=3, max_length=64)
    theirs = LandmarkTokenizer(hf, strategy="fixed", chunk_size=3, max_length=64, placement="authors")
    content = hf("one two three four five six seven", add_special_tokens=False)["input_ids"]
    n, bos, eos = len(content), hf.bos_token_id, hf.eos_token_id
    chunks = [content[i:i + 3] for i in range(0, n, 3)]
    after = [bos] + [t for c in chunks for t in [*c, eos]]
    before = [bos] + [t for c in chunks for t in [eos, *c]]
    for tok, want in ((ours, after), (theirs, before)):
        hf.padding_side = "right"
        try:
            f = tok(["one two three four five six seven"])
        finally:
            hf.padding_side = "left"
        assert f["input_ids"][0].tolist() == want
        assert f["input_ids"][0][f["pool_mask"][0]].eq(eos).all() and int(f["pool_mask"].sum()) == len(chunks)
    assert theirs.config()["placement"] == "authors" and "placement" not in ours.config()


@pytest.mark.parametrize("placement", ["after", "authors"])
def test_under_the_authors_placement_no_landmark_sees_the_last_chunk(decoder, placement) -> None:
    """A causal model: change only the last chunk's tokens. With the landmark after each chunk the last landmark has
    read them and the embedding moves; with the authors' (before each chunk, none after the last) nothing pooled
    has, and the embedding is bit for bit the same: what their placement costs."""
    model = decoder.with_pooling(pool("lmk-fixed", chunk_size=4, placement=placement))
    hf = model.tokenizer
    head = hf("the first chunk here and the second chunk here", add_special_tokens=False)["input_ids"][:8]
    tails = [hf(w, add_special_tokens=False)["input_ids"][:3] for w in (" alpha beta gamma", " river stone cloud")]
    assert all(len(t) == 3 for t in tails) and tails[0] != tails[1]
    texts = [hf.decode(head + t) for t in tails]
    ids = [model.tokenize([t])["input_ids"][0].tolist() for t in texts]
    assert ids[0][:-4] == ids[1][:-4] and ids[0] != ids[1]  # the texts differ in their last chunk only
    a, b = model.encode(texts[:1]), model.encode(texts[1:])
    if placement == "authors":
        assert np.array_equal(a, b)
    else:
        assert not np.allclose(a, b, atol=1e-4)


def test_placement_is_config_and_refused_where_it_has_no_meaning() -> None:
    assert PoolingConfig.coerce(pool("lmk-fixed-authors")).placement == "authors"
    assert "placement" not in PoolingConfig.coerce(pool("lmk-fixed")).to_dict()  # old rows keep their description
    with pytest.raises(ConfigError, match="placement"):
        PoolingConfig.coerce(pool("lmk-sentence", placement="authors"))
    with pytest.raises(ConfigError, match="allowed values: after, authors"):
        PoolingConfig.coerce(pool("lmk-fixed", placement="before"))


def test_decoder_configs_validate_with_the_authors_lora() -> None:
    for name in ("granite-4.1-8b", "mistral-7b-v0.3", "granite-3.3-8b", "llm2vec-llama-3-8b", "decoder-1b-shape"):
        cfg = EncoderConfig.coerce(enc(name))
        assert cfg.dtype == "bfloat16" and cfg.padding_side == "left"
        assert cfg.lora == {"r": 64, "alpha": 32, "dropout": 0.1, "target_modules": [
            "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}
    assert "lora" not in EncoderConfig.coerce(enc("tiny-modernbert")).to_dict()
    with pytest.raises(ConfigError, match="unknown keys"):
        EncoderConfig.coerce(enc("tiny-decoder", lora={"rank": 8}))
    with pytest.raises(ConfigError, match="padding_side"):
        EncoderConfig.coerce(enc("tiny-decoder", padding_side="middle"))


# ----------------------------------------------------------------------------------------------- instructions
INSTRUCTION = "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery: "


@pytest.mark.parametrize("placement", ["after", "authors"])
def test_landmarks_go_in_the_text_not_in_the_instruction(decoder, placement) -> None:
    model = decoder.with_pooling(pool("lmk-fixed", chunk_size=4, placement=placement))
    hf, query = model.tokenizer, "what is landmark pooling on decoders"
    plain = model.tokenize([query])
    with_prompt = model.tokenize([query], prompt=INSTRUCTION)
    prompt_ids = hf(INSTRUCTION, add_special_tokens=False)["input_ids"]
    ids, pooled = with_prompt["input_ids"][0], with_prompt["pool_mask"][0]
    assert ids[0] == hf.bos_token_id and ids[1:1 + len(prompt_ids)].tolist() == prompt_ids  # after the lead token
    assert not pooled[:1 + len(prompt_ids)].any() and hf.eos_token_id not in prompt_ids  # no landmark in it
    # the text's layout follows unchanged: the same chunks, the same landmarks
    assert ids[1 + len(prompt_ids):].tolist() == plain["input_ids"][0][1:].tolist()
    assert pooled[1 + len(prompt_ids):].tolist() == plain["pool_mask"][0][1:].tolist()
    # one prompt per text, and a text without one
    both = model.tokenize([query, query], prompt=[INSTRUCTION, None])
    assert both["attention_mask"][0].sum() == len(ids) and both["attention_mask"][1].sum() == len(plain["input_ids"][0])


def test_an_instruction_travels_as_a_sentence_transformers_prompt(decoder, tmp_path) -> None:
    from sentence_transformers import SentenceTransformer

    from lmk.sharing.st_folder import export_sentence_transformers

    texts = ["what is landmark pooling", "a second query about decoders and their landmarks"]
    ref = decoder.encode(texts, prompt=INSTRUCTION)
    assert not np.allclose(ref, decoder.encode(texts), atol=1e-4)  # the instruction changes the query
    folder = export_sentence_transformers(decoder, tmp_path / "export", prompts={"query": INSTRUCTION})
    st = SentenceTransformer(str(folder), trust_remote_code=True, device="cpu")
    assert st.prompts["query"] == INSTRUCTION
    np.testing.assert_allclose(st.encode(texts, prompt_name="query", convert_to_numpy=True), ref, atol=1e-5)
    np.testing.assert_allclose(st.encode(texts, convert_to_numpy=True), decoder.encode(texts), atol=1e-5)


def test_a_sources_instruction_reaches_its_queries_only(decoder, tmp_path) -> None:
    import datasets

    from lmk.config.data import DataConfig
    from lmk.data.collator import PairCollator
    from lmk.data.sampling import PairDataset

    rows = [{"query": f"query {i} about rivers", "pos": [f"rivers {i} flow"], "neg": [f"stones {i}"]} for i in range(2)]
    sources = [datasets.Dataset.from_list(rows), datasets.Dataset.from_list(rows)]
    data = PairDataset(sources, group_size=2, seed=0, query_prompts=[INSTRUCTION, None])
    examples = [data[(0, 0)], data[(0, 2)]]  # one row of each source
    assert examples[0]["query_prompt"] == INSTRUCTION and "query_prompt" not in examples[1]
    model = decoder.with_pooling(pool("lmk-fixed", chunk_size=4))
    batch = PairCollator(model.landmark_tokenizer, query_max_length=64, passage_max_length=32)(examples)
    want = model.tokenize([rows[0]["query"], rows[0]["query"]], side="query", prompt=[INSTRUCTION, None],
                          max_length=64)
    assert torch.equal(batch["query"]["input_ids"], want["input_ids"])
    assert torch.equal(batch["query"]["pool_mask"], want["pool_mask"])
    passages = model.tokenize([p for e in examples for p in e["passages"]], max_length=32)
    assert torch.equal(batch["passage"]["input_ids"], passages["input_ids"])  # passages get no instruction
    # config: a string or null, and map-style sources only
    cfg = DataConfig.coerce({"sources": [{"path": "local", "query_prompt": INSTRUCTION}]})
    assert cfg.sources[0].query_prompt == INSTRUCTION
    with pytest.raises(ConfigError, match="map-style"):
        DataConfig.coerce({"sources": [{"path": "local", "query_prompt": INSTRUCTION}], "streaming": True})


def test_an_eval_tasks_instruction_reaches_its_queries_only(decoder) -> None:
    from types import SimpleNamespace

    from mteb.types import PromptType

    from lmk.config.eval import EvalConfig
    from lmk.eval.encoder import LmkEncoder

    texts = ["what is landmark pooling", "rivers and their stones"]
    loader = [{"text": texts}]
    task = SimpleNamespace(name="NFCorpus")
    plain = LmkEncoder(decoder)
    instructed = LmkEncoder(decoder, query_prompts={"NFCorpus": INSTRUCTION})
    q = instructed.encode(loader, task_metadata=task, hf_split="test", hf_subset="default",
                          prompt_type=PromptType.query)
    np.testing.assert_array_equal(q, decoder.encode(texts, side="query", max_length=512, prompt=INSTRUCTION))
    d = instructed.encode(loader, task_metadata=task, hf_split="test", hf_subset="default",
                          prompt_type=PromptType.document)
    np.testing.assert_array_equal(d, plain.encode(loader, task_metadata=task, hf_split="test", hf_subset="default",
                                                   prompt_type=PromptType.document))
    other = instructed.encode(loader, task_metadata=SimpleNamespace(name="SciFact"), hf_split="test",
                              hf_subset="default", prompt_type=PromptType.query)
    np.testing.assert_array_equal(other, plain.encode(loader, task_metadata=task, hf_split="test",
                                                       hf_subset="default", prompt_type=PromptType.query))
    # the mteb meta says so, and instructed results never share a cache entry with plain ones
    assert instructed.mteb_model_meta.use_instructions and not plain.mteb_model_meta.use_instructions
    assert instructed.mteb_model_meta.experiment_name != plain.mteb_model_meta.experiment_name
    assert EvalConfig.coerce({"query_prompts": {"NFCorpus": INSTRUCTION}}).query_prompts == {"NFCorpus": INSTRUCTION}
    with pytest.raises(ConfigError, match="query_prompts"):
        EvalConfig.coerce({"query_prompts": ["an instruction without its task"]})
