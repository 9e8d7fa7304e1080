"""Code above the model core speaks the family protocol, and layers point one way.

- No string in bertlab/ outside the family modules spells one family's names: no "bert." weight/hook
  prefix, no literal [MASK]/[UNK]/[CLS]/[SEP]/[PAD], no "##" test (docstrings and comments may name
  them; the tokenizer's WordPiece code may use them). No allow-list: every leak fails.
- Each module imports only from its own layer or the layers below (STYLE.md, "Layers point one way").
- The protocol works on a family that is not BERT: training's trainable prefixes, the analysis
  hooks, the cache's layer lookup.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch

import bertlab
from bertlab.hooks import ActivationCache

ROOT = Path(bertlab.__file__).resolve().parent
LEAK = re.compile(r"(?<![A-Za-z0-9_])bert\.|\[(?:MASK|UNK|CLS|SEP|PAD)\]|##")

# Where a family's own names belong.
EXEMPT = (
    "families/",  # one module per family: its weight names and special tokens
    "tokenizer.py",  # the tokenizer's WordPiece code: its default special tokens and the "##" prefix
)


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def family_leaks(path: Path) -> list[tuple[int, str, str]]:
    """(line, literal, string) of each string constant (not a docstring) that spells a family's names."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            for m in LEAK.finditer(node.value):
                found.append((node.lineno, m.group(0), node.value[:60]))
    return found


def _modules() -> list[tuple[str, Path]]:
    return [(p.relative_to(ROOT).as_posix(), p) for p in sorted(ROOT.rglob("*.py"))]


def test_no_family_names_outside_the_family_modules():
    found = [f"{rel}:{line}: {literal!r} in {text!r}" for rel, path in _modules() if not rel.startswith(EXEMPT)
             for line, literal, text in family_leaks(path)]
    assert not found, "family names outside bertlab/families:\n" + "\n".join(found)


def test_no_family_encoder_attribute_outside_the_family_modules():
    """`model.bert(...)` reaches into one family's module tree: use the protocol (hooks) instead."""
    from bertlab.families import FAMILIES

    # ModernBERT's encoder attribute is `model` (transformers' name), which is also what every caller calls
    # a model (`state.model`): that one name cannot be told apart by reading attribute names.
    prefixes = {f.prefix for f in FAMILIES.values()} - {"model"}
    found = []
    for rel, path in _modules():
        if rel.startswith(EXEMPT) or rel == "model.py":  # model.py: `Bert` itself, the BERT family's model
            continue
        found += [f"{rel}:{n.lineno}: .{n.attr}" for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                  if isinstance(n, ast.Attribute) and n.attr in prefixes]
    assert not found, "\n".join(found)


def test_the_leak_scanner_sees_code_but_not_prose(tmp_path):
    f = tmp_path / "m.py"
    f.write_text('"""Docstring with [MASK] and ##ing."""\n# comment: bert.encoder\n'
                 'def f(tok):\n    """[CLS] doc."""\n    return f"type [MASK] at {tok}", "bert.pooler.", "##"\n'
                 'ROBERTA = "roberta.encoder"\n')
    assert sorted(lit for _, lit, _ in family_leaks(f)) == ["##", "[MASK]", "bert."]


# ---------------------------------------------------------------------------------------------
# Every family fact in its family's module: no family name, no model_type branch elsewhere
# ---------------------------------------------------------------------------------------------
def family_names() -> set[str]:
    """The registry's model types and the pre-training objectives' names ("roberta", "spanbert", ...)."""
    from bertlab.families import FAMILIES
    from bertlab.training.objectives import OBJECTIVES

    return set(FAMILIES) | set(OBJECTIVES)


def _defines_objective(path: Path) -> bool:
    """Whether the module assigns a top-level `OBJECTIVE` (a pre-training objective's own module)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return any(isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "OBJECTIVE" for t in n.targets)
               for n in tree.body)


def _own_modules() -> tuple[str, ...]:
    """Where a family's facts belong: its family module, and a pre-training objective's own module."""
    objectives = sorted((ROOT / "training" / "objectives").glob("*.py"))
    own = [p.relative_to(ROOT).as_posix() for p in objectives if _defines_objective(p)]
    assert len(own) >= 5, own  # bert, roberta, albert, electra, spanbert at least
    return ("families/", *own)


def _names_model_type(node: ast.AST) -> bool:
    """`x.model_type`, `model_type`, or `x.family.name` (a model's family by name)."""
    if isinstance(node, ast.Name):
        return node.id == "model_type"
    if isinstance(node, ast.Attribute):
        return node.attr == "model_type" or (
            node.attr == "name" and isinstance(node.value, ast.Attribute) and node.value.attr == "family")
    return False


def _strings(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and bool(node.elts) and all(map(_strings, node.elts))


def _spec_default(tree: ast.AST) -> set[int]:
    """The neutral spec's default family (`model_type: str = ...` in a class body): the one name config.py
    holds, the family whose config.json BertConfig reads."""
    return {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.ClassDef) for n in n.body
            if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.target.id == "model_type"
            and n.value is not None}


def family_facts(path: Path, names: set[str], pair_heads: bool = True) -> list[tuple[int, str]]:
    """(line, what) of each family fact in `path`: a string (not a docstring) that is a family's or an
    objective's name, a comparison of a model_type (or a model's family name) with strings, and (when
    `pair_heads`) a test of a pair head's name in a model's heads (`model.family.pair_task` says it)."""
    from bertlab.config import PAIR_HEADS

    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _docstrings(tree) | _spec_default(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names \
                and id(node) not in skip:
            found.append((node.lineno, f"family name {node.value!r}"))
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(map(_names_model_type, sides)) and any(map(_strings, sides)):
                found.append((node.lineno, "model_type branch"))
            heads = [s for s in node.comparators if isinstance(s, ast.Attribute) and s.attr == "pretraining_heads"]
            if pair_heads and heads and isinstance(node.left, ast.Constant) and node.left.value in PAIR_HEADS:
                found.append((node.lineno, f"pair-task test {node.left.value!r} in ….pretraining_heads"))
    return found


def test_no_family_facts_outside_the_family_modules():
    """Adding a member touches its own module and the registry: model types, objectives, the pair task,
    positions and the Family tab's texts come from the registry, never from a name test elsewhere."""
    names, own = family_names(), _own_modules()
    found = [f"{rel}:{line}: {what}" for rel, path in _modules() if not rel.startswith(own)
             for line, what in family_facts(path, names, pair_heads=rel not in ("model.py", "config.py"))]
    assert not found, "family facts outside their family's module:\n" + "\n".join(found)


def test_the_family_fact_scanner_sees_names_and_branches(tmp_path):
    f = tmp_path / "m.py"
    f.write_text('"""The roberta docstring may name it."""\n'
                 'KINDS = ("bert", "roberta")\n'
                 'class C:\n    model_type: str = "bert"\n'
                 'def f(model, objective):\n'
                 '    """albert in prose."""\n'
                 '    if model.config.model_type == "xlnet": return 1\n'
                 '    if model.family.name in ("gpt2", "t5"): return 2\n'
                 '    if objective.model_type != model.config.model_type: return 3\n'
                 '    return "sop" if "sop" in model.config.pretraining_heads else "RoBERTa and BERT"\n')
    found = sorted(what for _, what in family_facts(f, {"bert", "roberta", "albert"}))
    assert found == ["family name 'bert'", "family name 'roberta'", "model_type branch", "model_type branch",
                     "pair-task test 'sop' in ….pretraining_heads"]


def import_graph() -> dict[str, set[str]]:
    """bertlab module -> the bertlab modules it imports (at the top or inside a function). Importing
    `a.b.c` runs package `a.b` first: an edge to each such package too, unless the importer is inside it."""
    graph: dict[str, set[str]] = {}
    for rel, path in _modules():
        me = _module_name(rel)
        targets = graph.setdefault(me, set())
        for _, target in imports_of(path):
            parts = target.split(".")
            for i in range(1, len(parts)):
                package = ".".join(parts[:i])
                if not (me == package or me.startswith(package + ".")):
                    targets.add(package)
            targets.add(target)
    return graph


def cycles(graph: dict[str, set[str]], among: set[str]) -> list[list[str]]:
    """The strongly connected components of more than one module of `graph` restricted to `among`."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in among:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(among):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_in_the_model_core():
    """The model core (tokenizer, config, hooks, model, the families) imports one way: the families build on
    `bertlab.model`, which never imports them back, not even inside a function."""
    graph = import_graph()
    core = {m for m in graph if layer_of(m)[0] <= 1}
    assert "bertlab.model" in core and "bertlab.families.core" in core
    found = cycles(graph, core)
    assert not found, "import cycles in the model core:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_cycle_finder_sees_a_cycle_through_a_function_import():
    graph = {"bertlab.model": {"bertlab.families"}, "bertlab.families": {"bertlab.families.bert"},
             "bertlab.families.bert": {"bertlab.model"}, "bertlab.config": set()}
    assert cycles(graph, set(graph)) == [["bertlab.families", "bertlab.families.bert", "bertlab.model"]]
    graph["bertlab.model"] = set()
    assert cycles(graph, set(graph)) == []


# ---------------------------------------------------------------------------------------------
# Layers point one way
# ---------------------------------------------------------------------------------------------
# Package (or top-level module) -> layer. A module may import from its own layer or the ones below;
# every module of a package has the package's layer: no module has a layer of its own.
LAYERS: dict[str, int] = {
    "bertlab.tokenizer": 0, "bertlab.config": 0, "bertlab.hooks": 0, "bertlab.settings": 0,
    "bertlab.runtime": 0, "bertlab.inputs": 0, "bertlab.workspace": 0, "bertlab.options": 0,
    "bertlab.service_client": 0,  # HTTP to the class service, for the store (classroom) and the queue (training)
    "bertlab.masks": 0,  # attention masks as functions: the models apply them, the views draw them
    "bertlab.model": 1, "bertlab.fast": 1, "bertlab.families": 1,
    "bertlab.weights": 2, "bertlab.compressed": 2, "bertlab.loading": 3, "bertlab.default_heads_file": 3,
    "bertlab.hub": 3,
    "bertlab.tasks": 4,  # task specs, readers, features, metrics, decoding: below training and analysis
    "bertlab.training": 5, "bertlab.analysis": 5,
    "bertlab.compress": 6, "bertlab.recipes": 6, "bertlab.viz": 6, "bertlab.classroom": 6,
    "bertlab.panels": 7,
    "bertlab.serving": 8, "bertlab.hubservice": 8, "bertlab.cli": 8, "bertlab.explain_cli": 8, "bertlab": 8,
}
# the two halves of a layer that must not lean on each other
SIBLINGS = (("bertlab.training", "bertlab.analysis"), ("bertlab.analysis", "bertlab.training"))


def test_the_layers_are_packages():
    """No entry names a module inside a package: a package has one layer, all its modules share it."""
    inside = [name for name in LAYERS if name.count(".") > 1]
    assert not inside, inside
    for name in LAYERS:
        if name != "bertlab":
            path = ROOT.parent / name.replace(".", "/")
            assert path.is_dir() or path.with_suffix(".py").is_file(), name


def layer_of(module: str) -> tuple[int, str]:
    best = max((p for p in LAYERS if module == p or module.startswith(p + ".")), key=len)
    return LAYERS[best], best


def _module_name(rel: str) -> str:
    parts = rel.removesuffix(".py").split("/")
    return ".".join(["bertlab", *parts[:-1]] + ([] if parts[-1] == "__init__" else [parts[-1]]))


NAMED_MODULE = re.compile(r"^bertlab(?:\.\w+)+(?::\w+)?$")  # "bertlab.panels.mask:MaskPanel", "bertlab.loading"


def _is_module(name: str) -> bool:
    where = ROOT.parent / name.replace(".", "/")
    return where.with_suffix(".py").is_file() or where.is_dir()


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every bertlab import, at the top or inside a function; `from bertlab import x`
    counts as `bertlab.x` when x is a module. A module named in a string ("bertlab.loading", a tab's
    "bertlab.panels.mask:MaskPanel") counts too: that is how lazy imports (`importlib.import_module`)
    name what they import."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and NAMED_MODULE.match(node.value):
            name = node.value.split(":")[0]
            if _is_module(name):
                out.append((node.lineno, name))
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "bertlab":
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                out.append((node.lineno, sub if _is_module(sub) else node.module))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "bertlab"]
    return out


def layering_violations() -> list[str]:
    bad = []
    for rel, path in _modules():
        me = _module_name(rel)
        mine, my_prefix = layer_of(me)
        for line, target in imports_of(path):
            theirs, their_prefix = layer_of(target)
            sideways = any(me.startswith(a) and their_prefix.startswith(b) and mine == theirs
                           for a, b in SIBLINGS)
            if theirs > mine or sideways:
                bad.append(f"{rel}:{line}: {me} (layer {mine}) imports {target} (layer {theirs})")
    return bad


def test_layers_point_one_way():
    bad = layering_violations()
    assert not bad, "imports that point up or sideways:\n" + "\n".join(bad)


@pytest.mark.parametrize("module, target", [
    ("bertlab.loading", "bertlab.recipes.default_heads"),  # the heads file's path and layers moved down
    ("bertlab.training.finetune", "bertlab.analysis"),  # eval_mode, model_device, max_tokens: bertlab.runtime
    ("bertlab.training.masking", "bertlab.training.loop"),  # derive_seed: bertlab.runtime
    ("bertlab.viz.pretrain", "bertlab.training.masking.mask_tokens"),  # masks are computed in training.preview
])
def test_the_named_cycles_are_cut(module, target):
    path = ROOT.parent / (module.replace(".", "/") + ".py")
    if not path.is_file():
        path = path.with_suffix("") / "__init__.py"
    src = path.read_text(encoding="utf-8")
    imported = {t for _, t in imports_of(path)}
    if target.endswith("mask_tokens"):
        assert "mask_tokens(" not in src and "derive_seed" not in src
    else:
        assert not any(t == target or t.startswith(target + ".") for t in imported), imported


# ---------------------------------------------------------------------------------------------
# The protocol on a family that is not BERT
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def roberta(tmp_path_factory):
    from tiny_models import family_folder

    folder = family_folder(tmp_path_factory.mktemp("layering"), "roberta")
    return bertlab.load(str(folder))


def test_training_prefixes_follow_the_family(roberta):
    from bertlab.training.finetune import is_trainable
    from bertlab.training.pretrain import freeze_for_heads, trainable_prefixes

    model, _ = roberta
    prefixes = trainable_prefixes(model, 1)
    assert prefixes == ("lm_head.", "roberta.pooler.", "roberta.encoder.layer.1.")
    freeze_for_heads(model, top_layers=1)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    try:
        assert names and all(n.startswith(prefixes) for n in names)
        assert any(n.startswith("lm_head.") for n in names) and any(".layer.1." in n for n in names)
    finally:
        for p in model.parameters():
            p.requires_grad = True
    family = model.family
    assert is_trainable("roberta.encoder.layer.0.output.LayerNorm.weight", "adapter", family)
    assert not is_trainable("roberta.encoder.layer.0.output.LayerNorm.weight", "feature", family)
    assert is_trainable("roberta.pooler.dense.weight", "feature", family)


def test_analysis_reads_a_roberta_model(roberta):
    from bertlab.analysis.ablation import masked_query
    from bertlab.analysis.representation import input_representation
    from bertlab.analysis.similarity import token_similarity

    model, tok = roberta
    assert tok.mask_token == "<mask>"
    sim = token_similarity(model, tok, "The quick brown fox.")
    assert len(sim.matrices) == model.config.num_hidden_layers + 1
    rep = input_representation(model, tok, "The quick brown fox.")
    assert rep.tokens[0] == "<s>"
    q = masked_query(model, tok, f"The quick brown {tok.mask_token}.")
    assert q.mask_token == "<mask>"


def test_cls_vectors_of_any_family_equal_the_encoder_output(roberta):
    from bertlab.analysis.predict import cls_vectors

    model, tok = roberta
    texts = ["The quick brown fox.", "Café and naïve."]
    got = cls_vectors(model, tok, texts)
    batch = tok.encode_batch(texts, [None, None], 64)
    want = model(batch.input_ids, batch.token_type_ids, batch.attention_mask).last_hidden_state[:, 0]
    torch.testing.assert_close(got, want.float(), rtol=0, atol=1e-6)


def test_cache_finds_layers_through_the_protocol(roberta):
    model, tok = roberta
    ids = torch.tensor([tok.encode("The quick brown fox.").ids])
    _, cache = model.run_with_cache(ids, names=lambda n: n.endswith("hook_pattern"))
    assert cache.layers is not None
    assert cache.stack("hook_pattern").shape[0] == model.config.num_hidden_layers
    assert torch.equal(cache.layer(1, "hook_pattern"), cache[model.family.hook_name(1, "hook_pattern")])
    bare = ActivationCache(cache)
    with pytest.raises(KeyError, match="run_with_cache"):
        bare.layer(0, "hook_pattern")


# ---------------------------------------------------------------------------------------------
# No import cycles anywhere in the package, imports inside functions included
# ---------------------------------------------------------------------------------------------
def test_no_import_cycles():
    graph = import_graph()
    found = cycles(graph, set(graph))
    assert not found, "modules that import each other (imports inside functions count):\n" + "\n".join(
        " <-> ".join(c) for c in found)


def test_imports_inside_functions_count(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def late():\n    from bertlab.loading import load\n    return load\n")
    assert [t for _, t in imports_of(f)] == ["bertlab.loading"]
    f.write_text('import importlib\nTAB = "bertlab.panels.mask:MaskPanel"\n'
                 'def lazy():\n    return importlib.import_module("bertlab.loading")\nWORD = "bertlab.nothing"\n')
    assert sorted(t for _, t in imports_of(f)) == ["bertlab.loading", "bertlab.panels.mask"]


# ---------------------------------------------------------------------------------------------
# No private torch API (issue 47): what a newer torch may change without notice
# ---------------------------------------------------------------------------------------------
PRIVATE_TORCH = re.compile(r"torch\._C\b|_global_\w*hooks|\._(forward|backward)(_pre)?_hooks\b|\.grad_scale\s*="
                           r"|torch\.\w+\._is_|_is_(avx|amx)\w*_supported|torch\._(?!C\b)[a-z]\w*|torch\.ops\.aten\._")


def test_no_module_uses_private_torch_api():
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if PRIVATE_TORCH.search(line):
                found.append(f"{rel}:{i}: {line.strip()}")
    assert not found, "\n".join(found)
