"""How a conversation becomes tokens: the tokenizer's own chat template, read one way everywhere.

TRL keeps this knowledge in the tokenizer. ``GRPOTrainer`` prompts with
``processing_class.apply_chat_template(prompts, add_generation_prompt=True, tokenize=True)``
(the template's text, tokenized without adding special tokens), and between two turns of its
tool loop it appends what the template adds for the new messages (``_get_tool_suffix_ids``), so
that ``prompt + completion`` is the template's rendering of the conversation. :class:`ChatFormat`
does the same for one tokenizer and one template, and every path of the package that turns a
conversation into tokens for a policy goes through it: the rollout function's prompt and every
later turn (``rollouts/_episodes``), :class:`~torchrl_trl_interop.TrainerModelPolicy`, the
rollout worker's check of a collector's policy.

* **Which template.** The tokenizer's own (``tokenizer.chat_template``), or the one a caller
  names: a template's text, or one of torchrl's templates by name (``chat_template_name``, as a
  torchrl LLM wrapper takes it). torchrl's own choice when nothing is named (a family picked by
  keywords of ``tokenizer.name_or_path``, ChatML otherwise) is never used: it renders another
  format than the tokenizer's for most real templates.
* **The model's answer.** A turn ends at a stop token: the tokenizer's eos, the token the
  template closes an assistant turn with (``<|eot_id|>``, ``<end_of_turn>``, ``<|im_end|>``) and
  any the caller adds (a generation config's eos list). :meth:`ChatFormat.answer` reads the
  answer's content from the sampled ids without its trailing stop tokens.
* **Between turns.** :meth:`ChatFormat.added_text` is the text the template writes after an
  answer and before the next generation: the rest of the answer's closing and the new messages,
  each rendered as the template renders them.
* **What a template cannot do is refused, naming it.** A template that raises on a role, or
  renders a message without its content (Gemma, Cohere and gpt-oss refuse ``tool`` turns;
  Phi-3 drops them), and, for several turns, a template whose render of a conversation is not
  the render of its first turns continued (Qwen3 drops past reasoning): as TRL does in its tool
  loop, TRL's training variant of the template is used where TRL ships one
  (``trl.chat_template_utils.get_training_chat_template``), otherwise the call is refused.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ._keys import PLACEHOLDER_ROLE

__all__ = ["ChatFormat", "answer_turn", "opening_of", "template_name", "torchrl_template"]

Message = dict[str, Any]

#: a sentinel no model writes, to find a template's text around a message's content
_PROBE = "Q7xProbeAnswerZ"
_ENV_PROBE = "Q7xProbeReplyZ"
#: ChatFormat objects per tokenizer, per (template, keyword arguments): probes run once
_FORMATS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@functools.lru_cache(maxsize=1)
def _known_templates() -> dict[str, str]:
    """Template text -> its name, for the templates TRL ships and torchrl's named ones."""
    import importlib.resources

    names: dict[str, str] = {}
    for name in ("chatml_format", "qwen", "llama", "deepseek", "falcon", "dialogpt"):
        try:
            names[torchrl_template(name)] = f"torchrl's {name!r} template"
        except (KeyError, ValueError):  # not a name of this torchrl version
            pass
    try:
        folder = importlib.resources.files("trl") / "chat_templates"
        for entry in folder.iterdir():
            if entry.name.endswith(".jinja"):
                names[entry.read_text()] = f"TRL's {entry.name}"
    except (ModuleNotFoundError, FileNotFoundError):
        pass
    return names


class _Recorder:
    """Stands for a tokenizer in ``History.apply_chat_template``: keeps the template it gets."""

    chat_template = None
    name_or_path = ""

    def __init__(self) -> None:
        self.template: str | None = None

    def apply_chat_template(self, conversation: Any = None, **kwargs: Any) -> str:
        self.template = kwargs.get("chat_template")
        return ""


@functools.lru_cache(maxsize=16)
def torchrl_template(name: str) -> str:
    """The text of one of torchrl's named chat templates (``History.apply_chat_template``'s
    ``chat_template_name``), as torchrl hands it to the tokenizer.

    Raises:
        KeyError: if torchrl has no template of that name.

    Examples:
        >>> "<|im_start|>" in torchrl_template("chatml_format")
        True
    """
    from tensordict import set_list_to_stack
    from torchrl.data.llm import History

    recorder = _Recorder()
    with set_list_to_stack(True):
        probe = History.from_chats([[{"role": "user", "content": "?"}]])[0]
    probe.apply_chat_template(tokenizer=recorder, chat_template_name=name)
    if recorder.template is None:  # pragma: no cover - torchrl passes it
        raise KeyError(name)
    return recorder.template


def template_name(template: str | None, tokenizer: Any = None) -> str:
    """A chat template as errors name it: TRL's file or torchrl's name when it is one of theirs.

    Examples:
        >>> from trl.chat_template_utils import qwen3_chat_template
        >>> template_name(qwen3_chat_template)
        "TRL's qwen3.jinja"
        >>> template_name("{{ messages[0].content }}")
        "the chat template '{{ messages[0].content }}'"
    """
    if template is None:
        return "no chat template"
    known = _known_templates().get(template)
    if known is not None:
        return known
    owner = getattr(tokenizer, "name_or_path", "") if tokenizer is not None else ""
    start = " ".join(template.split())[:48]
    return (
        f"the chat template of {owner!r} ({start!r}...)"
        if owner
        else f"the chat template {start!r}"
    )


def _without_placeholders(conversation: Sequence[Message]) -> list[Message]:
    return [m for m in conversation if m.get("role") != PLACEHOLDER_ROLE]


def _template_error() -> tuple[type[Exception], ...]:
    from jinja2 import TemplateError

    return (TemplateError, TypeError, ValueError, KeyError, IndexError)


class ChatFormat:
    """One tokenizer's chat template as the package renders with it: prompts, answers, turns.

    Build it with :meth:`of` (cached per tokenizer and template). The template is the
    tokenizer's own unless ``chat_template`` (a template's text) or ``chat_template_name`` (one
    of torchrl's named templates) is given; ``template_kwargs`` go to every render (TRL's
    ``chat_template_kwargs``, e.g. ``{"enable_thinking": False}``).

    Args:
        tokenizer (PreTrainedTokenizerBase): the tokenizer whose template and vocabulary are used.

    Keyword Args:
        chat_template (str, optional): a template's text, used instead of the tokenizer's.
        chat_template_name (str, optional): the name of one of torchrl's templates
            (``torchrl.data.llm.History``'s ``chat_template_name``).
        template_kwargs (dict, optional): more keyword arguments for every render.

    Raises:
        ValueError: if no template is given and the tokenizer has none, or
            ``chat_template_name`` is not one of torchrl's names.

    Examples:
        >>> from torchrl_trl_interop.testing import toy_tokenizer
        >>> chat = ChatFormat.of(toy_tokenizer())
        >>> chat.render([[{"role": "user", "content": "Hi"}]], add_generation_prompt=True)
        ['<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n']
        >>> chat.turn_closing, chat.stop_ids()
        ('<|im_end|>\\n', [2])
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        chat_template: str | None = None,
        chat_template_name: str | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if chat_template is None and chat_template_name is not None:
            try:
                chat_template = torchrl_template(chat_template_name)
            except KeyError:
                raise ValueError(
                    f"chat_template_name={chat_template_name!r} is not one of torchrl's chat "
                    "templates (History.apply_chat_template's chat_template_name: "
                    "'chatml_format', 'qwen', 'llama', ...)."
                ) from None
        template = chat_template if chat_template is not None else _current_template(tokenizer)
        if not template:
            raise ValueError(
                f"the tokenizer {getattr(tokenizer, 'name_or_path', '') or type(tokenizer).__name__!r} "
                "has no chat template, and none was given: conversations cannot be rendered. "
                "Set tokenizer.chat_template (TRL ships real models' templates: "
                "trl/chat_templates/*.jinja) or pass the template."
            )
        self.tokenizer = tokenizer
        self.template: str = template
        self.template_kwargs: dict[str, Any] = dict(template_kwargs or {})
        self.name = template_name(template, tokenizer)
        self._checked_roles: dict[str, None] = {}
        self._turns: dict[tuple[str, ...], ChatFormat] = {}

    @classmethod
    def of(
        cls,
        tokenizer: Any,
        *,
        chat_template: str | None = None,
        chat_template_name: str | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> ChatFormat:
        """The :class:`ChatFormat` of ``tokenizer`` with that template, built once (its probes
        run once); a tokenizer that takes no weak reference gets a new one each time."""
        kwargs = dict(template_kwargs or {})
        if chat_template is not None and chat_template == _current_template(tokenizer):
            chat_template = None  # the tokenizer's own, named: the same format
        key = (
            chat_template,
            chat_template_name,
            _current_template(tokenizer),
            tuple(sorted((k, repr(v)) for k, v in kwargs.items())),
        )
        try:
            cache = _FORMATS.setdefault(tokenizer, {})
        except TypeError:
            cache = {}
        if key not in cache:
            cache[key] = cls(
                tokenizer,
                chat_template=chat_template,
                chat_template_name=chat_template_name,
                template_kwargs=kwargs,
            )
        return cache[key]

    @classmethod
    def of_policy(
        cls, policy: Any, tokenizer: Any, template_kwargs: Mapping[str, Any] | None = None
    ) -> ChatFormat:
        """The format a torchrl LLM policy is prompted in: the template it names
        (``chat_template`` / ``chat_template_name``), else its tokenizer's own (the policy's
        ``tokenizer`` wins over ``tokenizer``)."""
        tokenizer = getattr(policy, "tokenizer", None) or tokenizer
        return cls.of(
            tokenizer,
            chat_template=getattr(policy, "chat_template", None),
            chat_template_name=getattr(policy, "chat_template_name", None),
            template_kwargs=template_kwargs,
        )

    def __repr__(self) -> str:
        return f"ChatFormat({self.name})"

    # -- rendering ------------------------------------------------------------------------------

    def render(
        self,
        conversations: Sequence[Sequence[Message]],
        *,
        add_generation_prompt: bool,
        tools: list | None = None,
    ) -> list[str]:
        """Each conversation rendered with the template (torchrl's placeholder turns left out).

        Raises:
            ValueError: naming the template and the roles, if the template refuses a
                conversation (e.g. a ``tool`` turn where it allows only user and assistant).
        """
        conversations = [_without_placeholders(c) for c in conversations]
        if not conversations:
            return []
        distinct, at = _runs(conversations)  # GRPO's groups: one render per group
        try:
            texts = self.tokenizer.apply_chat_template(
                distinct,
                chat_template=self.template,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
                tools=tools or None,  # as TRL: some templates write tool boilerplate for []
                **self.template_kwargs,
            )
        except _template_error() as err:
            roles = [[m.get("role") for m in c] for c in conversations]
            raise ValueError(
                f"{self.name} cannot render the conversation (roles {roles!r:.300}): "
                f"{type(err).__name__}: {err}. Use a chat template that renders these roles "
                "(TRL ships real models' templates: trl/chat_templates/*.jinja), or an "
                "environment whose turns this template accepts."
            ) from err
        return [texts[i] for i in at]

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of rendered texts, as ``apply_chat_template(..., tokenize=True)`` makes them
        (no special token added: the template writes its own, a bos included): by the
        tokenizer's Rust backend where the tokenizer's call is only that
        (:func:`_encodes_in_backend`), else through the tokenizer. The backend encodes text by
        text (:func:`_each_distinct`), each run of equal texts once.

        Examples:
            >>> from torchrl_trl_interop.testing import toy_tokenizer
            >>> tok = toy_tokenizer()
            >>> ChatFormat.of(tok).encode(["Hi<|im_end|>"]) == [tok("Hi<|im_end|>")["input_ids"]]
            True
        """
        if not texts:
            return []
        texts = list(texts)
        if _encodes_in_backend(self.tokenizer):
            backend = self.tokenizer.backend_tokenizer
            encode = getattr(backend, "encode_batch_fast", backend.encode_batch)  # no offsets
            rows = _each_distinct(texts, lambda t: encode([t], add_special_tokens=False)[0].ids)
            if max(map(len, rows)) <= self.tokenizer.model_max_length:
                return rows
            # longer than the model takes: the tokenizer's own call, which warns of it
        return [list(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]

    def decode(
        self, rows: Sequence[Sequence[int]], *, skip_special_tokens: bool = False
    ) -> list[str]:
        """``tokenizer.batch_decode(rows, skip_special_tokens=...)`` (rows of ids or 1-D
        tensors): by the tokenizer's Rust backend where its decode is only that
        (:func:`_decodes_in_backend`), row by row (:func:`_each_distinct`), each run of equal rows
        once; else through the tokenizer.

        Examples:
            >>> from torchrl_trl_interop.testing import toy_tokenizer
            >>> chat = ChatFormat.of(toy_tokenizer())
            >>> chat.decode(chat.encode(["4<|im_end|>"])), chat.decode([[]])
            (['4<|im_end|>'], [''])
        """
        rows = [r.tolist() if hasattr(r, "tolist") else list(r) for r in rows]
        if _decodes_in_backend(self.tokenizer):
            backend = self.tokenizer.backend_tokenizer
            return _each_distinct(
                rows, lambda ids: backend.decode(ids, skip_special_tokens=skip_special_tokens)
            )
        return self.tokenizer.batch_decode(rows, skip_special_tokens=skip_special_tokens)

    def prompt_ids(
        self, conversations: Sequence[Sequence[Message]], *, tools: list | None = None
    ) -> list[list[int]]:
        """The ids a model is prompted with for each conversation: TRL's
        ``apply_chat_template(conversation, add_generation_prompt=True, tokenize=True)``."""
        return self.encode(self.render(conversations, add_generation_prompt=True, tools=tools))

    # -- the template's text around an assistant turn ---------------------------------------------

    def _probe(self, chat: list[Message], add_generation_prompt: bool) -> str:
        return self.render([chat], add_generation_prompt=add_generation_prompt)[0]

    @functools.cached_property
    def turn_closing(self) -> str:
        """The text the template writes after an assistant turn's content, before the next turn
        (ChatML ``<|im_end|>\\n``, Llama 3 ``<|eot_id|>``, Gemma ``<end_of_turn>\\n``): what a
        conversation ending there and one going on have in common, token for token (a template
        may end a whole conversation with more, as Phi-3 writes eos)."""
        user = {"role": "user", "content": "?"}
        answer = {"role": "assistant", "content": _PROBE}
        ends = self._probe([user, answer], False).split(_PROBE, 1)[-1]
        goes_on = self._probe([user, answer, user], False).split(_PROBE, 1)[-1]
        a, b = self.encode([ends, goes_on])
        common = 0
        while common < min(len(a), len(b)) and a[common] == b[common]:
            common += 1
        return self.tokenizer.decode(a[:common], skip_special_tokens=False)

    @functools.cached_property
    def answer_opening(self) -> str:
        """What the generation prompt of a first turn opens the answer with
        (:func:`opening_of` it)."""
        return opening_of(self._probe([{"role": "user", "content": "?"}], True))

    @functools.cached_property
    def end_of_turn_id(self) -> int | None:
        """The id of the token that closes an assistant turn, when the closing starts with a
        special or added token (``<|eot_id|>``, ``<end_of_turn>``, ``<|im_end|>``); else ``None``."""
        ids = self.encode([self.turn_closing])[0] if self.turn_closing else []
        whole = {int(i) for i in (getattr(self.tokenizer, "added_tokens_decoder", {}) or {})}
        return ids[0] if ids and ids[0] in whole else None

    def stop_ids(self, extra: Iterable[int] | int | None = None) -> list[int]:
        """The ids that end a turn: the tokenizer's eos, the template's end-of-turn token and
        ``extra`` (e.g. a generation config's ``eos_token_id``), without repeats.

        Examples:
            >>> from torchrl_trl_interop.testing import toy_tokenizer
            >>> ChatFormat.of(toy_tokenizer()).stop_ids([0])
            [2, 0]
        """
        extra = [] if extra is None else [extra] if isinstance(extra, int) else list(extra)
        ids = [getattr(self.tokenizer, "eos_token_id", None), self.end_of_turn_id, *extra]
        return list(dict.fromkeys(int(i) for i in ids if i is not None))

    def answer(
        self,
        ids: Sequence[int],
        extra_stop_ids: Iterable[int] | None = None,
        *,
        prompt_ids: Sequence[int] | None = None,
    ) -> tuple[str, bool]:
        """The content of an answer sampled as ``ids``, and whether it ended at a stop token.

        The trailing stop tokens (:meth:`stop_ids`) are the turn's end, not its content; the rest
        is decoded as it is (special tokens kept: a tool call's markup is the model's text),
        after what the prompt opened it with (:func:`opening_of` the end of ``prompt_ids``, the
        ids the model continued; a first turn's generation prompt without them), so that the
        template renders the answer again as the prompt and the sampled tokens spelled it.

        Examples:
            >>> from torchrl_trl_interop.testing import toy_tokenizer
            >>> chat = ChatFormat.of(toy_tokenizer())
            >>> chat.answer(chat.encode(["4<|im_end|>"])[0]), chat.answer(chat.encode(["4 and"])[0])
            (('4', True), ('4 and', False))
        """
        prompts = None if prompt_ids is None else [prompt_ids]
        return self.answers([ids], extra_stop_ids, prompt_ids=prompts)[0]

    def answers(
        self,
        rows: Sequence[Sequence[int]],
        extra_stop_ids: Iterable[int] | None = None,
        *,
        prompt_ids: Sequence[Sequence[int]] | None = None,
    ) -> list[tuple[str, bool]]:
        """:meth:`answer` of every row (``prompt_ids``: one per row), the stop tokens and the
        openings of prompts ending alike read once for the batch.

        Examples:
            >>> from torchrl_trl_interop.testing import toy_tokenizer
            >>> chat = ChatFormat.of(toy_tokenizer())
            >>> chat.answers(chat.encode(["4<|im_end|>", "4 and"]))
            [('4', True), ('4 and', False)]
        """
        stops = set(self.stop_ids(extra_stop_ids))
        ends = []
        for ids in rows:
            end = len(ids)
            while end and int(ids[end - 1]) in stops:
                end -= 1
            ends.append(end)
        contents = self.decode([list(ids[:end]) for ids, end in zip(rows, ends)])
        openings: dict[tuple[int, ...], str] = {}  # per prompt tail: GRPO's rows share one
        out = []
        for i, (ids, end, content) in enumerate(zip(rows, ends, contents)):
            if prompt_ids is None:
                opening = self.answer_opening
            else:
                tail = tuple(int(t) for t in list(prompt_ids[i])[-8:])
                if tail not in openings:
                    openings[tail] = opening_of(self.decode([tail])[0])
                opening = openings[tail]
            out.append((opening + content, end < len(ids)))
        return out

    def answer_turns(
        self,
        rows: Sequence[Sequence[int]],
        extra_stop_ids: Iterable[int] | None = None,
        *,
        prompt_ids: Sequence[Sequence[int]] | None = None,
    ) -> list[Any]:
        """:meth:`answers` of every row, each as a one-turn History (:func:`answer_turn`): the
        next assistant turn of its conversation.

        Examples:
            >>> from torchrl_trl_interop.testing import toy_tokenizer
            >>> chat = ChatFormat.of(toy_tokenizer())
            >>> [t.tolist() for t in chat.answer_turns(chat.encode(["4<|im_end|>"]))]
            [[{'role': 'assistant', 'content': '4', 'is_complete': True}]]
        """
        read = self.answers(rows, extra_stop_ids, prompt_ids=prompt_ids)
        return [answer_turn(content, complete) for content, complete in read]

    def added_after(
        self,
        conversations: Sequence[Sequence[Message]],
        answered: Sequence[int],
        sampled: Sequence[Sequence[int]],
        extra_stop_ids: Iterable[int] | None = None,
        *,
        tools: list | None = None,
    ) -> list[str]:
        """Per conversation, the text the template writes after the answer at index
        ``answered[i]`` and before the next generation: the answer's closing, less the stop token
        the model sampled (``sampled[i]``, the answer's ids), then every later message and the
        generation prompt, each as the template renders them (with ``tools``, as the prompt was
        rendered with them).

        A stop token other than the template's (Llama 3's ``<|end_of_text|>`` for its
        ``<|eot_id|>``) stands for the template's, as TRL aligns its tool suffix on eos; an
        answer cut short by the length limit gets the whole closing.

        Examples:
            >>> from torchrl_trl_interop.testing import toy_tokenizer
            >>> chat = ChatFormat.of(toy_tokenizer())
            >>> turns = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"},
            ...          {"role": "tool", "content": "2"}]
            >>> chat.added_after([turns], [1], chat.encode(["Yo<|im_end|>"]))
            ['\\n<|im_start|>tool\\n2<|im_end|>\\n<|im_start|>assistant\\n']
        """
        probes = []
        for chat, at in zip(conversations, answered):
            chat = list(_without_placeholders(chat))
            chat[at] = {**chat[at], "content": _PROBE}
            probes.append(chat)
        texts = self.render(probes, add_generation_prompt=True, tools=tools)
        stops = set(self.stop_ids(extra_stop_ids))
        end_of_turn = self.end_of_turn_id
        marker = (
            None
            if end_of_turn is None
            else self.tokenizer.decode([end_of_turn], skip_special_tokens=False)
        )
        out = []
        for text, ids in zip(texts, sampled):
            after = text.split(_PROBE, 1)[1]
            if ids and int(ids[-1]) in stops:
                last = self.tokenizer.decode([int(ids[-1])], skip_special_tokens=False)
                if after.startswith(last):
                    after = after[len(last) :]
                elif marker is not None and after.startswith(marker):
                    after = after[len(marker) :]
            out.append(after)
        return out

    # -- what a template can render ---------------------------------------------------------------

    def check_roles(self, roles: Iterable[str]) -> None:
        """Refuses a role the template cannot render after an assistant turn (it raises, or
        drops the message's content), naming the template and the role. Checked once per role.

        Raises:
            ValueError: naming the template and the role.

        Examples:
            >>> from trl.chat_template_utils import gemma_chat_template
            >>> from torchrl_trl_interop.testing import toy_template_tokenizer
            >>> ChatFormat.of(toy_template_tokenizer(gemma_chat_template)).check_roles(["tool"])
            Traceback (most recent call last):
            ...
            ValueError: TRL's gemma.jinja cannot render a 'tool' turn after an assistant turn, ...
        """
        for role in roles:
            if role in self._checked_roles or role in ("assistant", PLACEHOLDER_ROLE):
                continue
            chat = [
                {"role": "user", "content": "?"},
                {"role": "assistant", "content": "!"},
                {"role": role, "content": _ENV_PROBE},
            ]
            try:
                text = self.tokenizer.apply_chat_template(
                    chat,
                    chat_template=self.template,
                    add_generation_prompt=True,
                    tokenize=False,
                    **self.template_kwargs,
                )
            except _template_error() as err:
                raise ValueError(
                    f"{self.name} cannot render a {role!r} turn after an assistant turn, "
                    f"which the environment writes ({type(err).__name__}: {err}). Use a "
                    "chat template that renders it (TRL's qwen2_5.jinja, qwen3.jinja, "
                    "llama3_1.jinja... render 'tool' turns), or an environment that replies "
                    "with roles this template accepts."
                ) from err
            if _ENV_PROBE not in text:
                raise ValueError(
                    f"{self.name} drops the content of a {role!r} turn, which the "
                    "environment writes: the model would never see it. Use a chat template "
                    "that renders it (TRL's qwen2_5.jinja, qwen3.jinja, llama3_1.jinja... "
                    "render 'tool' turns)."
                )
            self._checked_roles[role] = None

    def _answers_written(self) -> list[str]:
        """What a model prompted with this template writes, as probes (the content its answer is
        stored with): a plain answer, or one after a reasoning block where the template reads
        them, opened by the generation prompt (:attr:`answer_opening`) or by the model."""
        opening = self.answer_opening
        if opening:  # the generation prompt opened a reasoning block: the model closes it
            return [f"{opening}Reasoning\n</think>\n\n{_PROBE}"]
        prompt = self._probe([{"role": "user", "content": "?"}], True)
        if "</think>" in self.template and "</think>" not in prompt:  # a thinking model
            return [f"<think>\nReasoning\n</think>\n\n{_PROBE}"]
        return [_PROBE]

    def turn_problem(self, roles: Sequence[str]) -> str | None:
        """Why this template would not render a rollout of several turns token for token
        (``None`` when it would): after an answer and a turn of each role, the next prompt must
        be the first prompt, the answer as the model wrote it, and more."""
        user = {"role": "user", "content": "?"}
        prompt = self._probe([user], True)
        for written in self._answers_written():
            answer = {"role": "assistant", "content": written}
            sampled = prompt + written[len(self.answer_opening) :]  # the opening is the prompt's
            for role in [*roles, None]:  # None: the environment adds no turn
                reply = [] if role is None else [{"role": role, "content": _ENV_PROBE}]
                after = self._probe([user, answer, *reply], True)
                if not after.startswith(sampled):
                    at = next(
                        (k for k, (a, b) in enumerate(zip(after, sampled)) if a != b),
                        min(len(after), len(sampled)),
                    )
                    after_what = "another answer" if role is None else f"a {role!r} turn"
                    return (
                        f"after {after_what}, it renders the assistant's earlier answer "
                        f"otherwise than the model wrote it ({after[max(at - 30, 0) : at + 30]!r} "
                        f"where the rollout holds {sampled[max(at - 30, 0) : at + 30]!r})"
                    )
        return None

    def for_turns(self, roles: Iterable[str]) -> ChatFormat:
        """The format to render conversations of several turns with, the environment replying
        in ``roles``: this one if it renders each conversation as its first turns continued, else
        TRL's training variant of the template (what ``GRPOTrainer``'s tool loop switches to in
        that case), if TRL has one that does. Checked once per set of roles.

        Raises:
            ValueError: naming the template and why, if neither does.
        """
        roles = tuple(r for r in dict.fromkeys(roles) if r not in ("assistant", PLACEHOLDER_ROLE))
        if roles in self._turns:
            return self._turns[roles]
        self.check_roles(roles)
        why = self.turn_problem(roles)
        if why is None:
            self._turns[roles] = self
            return self
        training = _training_template(self.tokenizer, self.template)
        if training is not None:
            fmt = ChatFormat.of(
                self.tokenizer, chat_template=training, template_kwargs=self.template_kwargs
            )
            fmt.check_roles(roles)
            if fmt.turn_problem(roles) is None:
                self._turns[roles] = fmt
                return fmt
        raise ValueError(
            f"{self.name} cannot render a rollout of several turns token for token: {why}. "
            "A multi-turn rollout trains on the prompt, the sampled answers and the "
            "environment's turns as one token sequence, which must be the template's "
            "rendering of the conversation. Use max_turns=1, or a template that renders "
            "earlier turns unchanged (TRL's *_training.jinja variants do)."
        )


def _runs(values: Sequence[Any]) -> tuple[list[Any], list[int]]:
    """The distinct values of each run of equal values (GRPO's groups: a prompt repeated
    ``num_generations`` times in a row) and, per value, the index of its run's.

    Examples:
        >>> _runs(["a", "a", "b", "a"])
        (['a', 'b', 'a'], [0, 0, 1, 2])
    """
    distinct: list[Any] = []
    at: list[int] = []
    for value in values:
        try:
            same = bool(distinct) and bool(value == distinct[-1])
        except (TypeError, ValueError, RuntimeError):  # an array inside: no truth value
            same = False
        if not same:
            distinct.append(value)
        at.append(len(distinct) - 1)
    return distinct, at


def _each_distinct(values: Sequence[Any], call: Any) -> list[Any]:
    """``[call(v) for v in values]``, called once per run of equal values (a list result copied
    for each value after the first).

    One call per value, not the tokenizer backend's batch call: on a rollout's small batches its
    thread pool costs several times the CPU of the work, and its threads spin on after it,
    beside the model's ``generate`` (figures: ``benchmarks/RESULTS.rst``, "Why the speed paths").

    Examples:
        >>> _each_distinct([[1], [1], [2]], sum)
        [1, 1, 2]
    """
    distinct, at = _runs(values)
    done = [call(value) for value in distinct]
    out = []
    for k, i in enumerate(at):
        value = done[i]
        out.append(list(value) if k and at[k - 1] == i and isinstance(value, list) else value)
    return out


@functools.cache
def _backend_class(cls: type) -> tuple[bool, bool]:
    """Whether the tokenizer class ``cls``'s call (``tokenizer(texts)``) and its decode
    (``batch_decode``) are its Rust backend's ``encode_batch`` and, row by row, ``decode``, and
    nothing more: a transformers fast tokenizer (``TokenizersBackend``) that keeps transformers' own
    call and ``_encode_plus`` (and has no target mode), and its own ``decode``,
    ``batch_decode`` and per-row ``_decode``. Read once per class."""
    try:
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:  # pragma: no cover - another transformers layout: its own calls
        return False, False
    if not issubclass(cls, TokenizersBackend):
        return False, False
    encodes = (
        cls.__call__ is PreTrainedTokenizerBase.__call__
        and cls._encode_plus is TokenizersBackend._encode_plus
        and not hasattr(cls, "_switch_to_input_mode")
    )
    decodes = (
        cls._decode is TokenizersBackend._decode
        and cls.decode is PreTrainedTokenizerBase.decode
        and cls.batch_decode is PreTrainedTokenizerBase.batch_decode
    )
    return encodes, decodes


def _encodes_in_backend(tokenizer: Any) -> bool:
    """Whether ``tokenizer(texts, add_special_tokens=False)`` is its Rust backend's
    ``encode_batch`` and nothing more (:func:`_backend_class`), its backend set as that call
    sets it for no padding, no truncation and the tokenizer's ``split_special_tokens`` (the
    call would reset the backend's padding and truncation first)."""
    if not _backend_class(type(tokenizer))[0]:
        return False
    backend = tokenizer.backend_tokenizer
    return (
        backend.padding is None
        and backend.truncation is None
        and backend.encode_special_tokens == bool(tokenizer.split_special_tokens)
    )


def _decodes_in_backend(tokenizer: Any) -> bool:
    """Whether ``tokenizer.batch_decode`` is its Rust backend's ``decode``, row by row, and
    nothing more (:func:`_backend_class`), cleaning up no spaces."""
    return _backend_class(type(tokenizer))[1] and not tokenizer.clean_up_tokenization_spaces


def opening_of(prompt: str) -> str:
    """What a prompt opens the answer with, which the answer's content holds when the template
    renders it again: a reasoning block the prompt ends by opening (``<think>\\n``: Qwen3.5,
    DeepSeek-R1 and Nemotron in thinking mode), else ``""``.

    Examples:
        >>> opening_of("<|im_start|>assistant\\n<think>\\n"), opening_of("<|im_start|>assistant\\n")
        ('<think>\\n', '')
    """
    at = prompt.rfind("<think>")
    return prompt[at:] if at >= 0 and not prompt[at + len("<think>") :].strip() else ""


def answer_turn(content: str, complete: bool, role: str = "assistant") -> Any:
    """An answer as a one-turn :class:`~torchrl.data.llm.History`, with the fields torchrl's
    parser writes (``is_complete``: whether the answer ended at a stop token), built directly
    (``History.from_chats`` costs ~0.1 ms a turn).

    Examples:
        >>> answer_turn("4", False).tolist()
        [{'role': 'assistant', 'content': '4', 'is_complete': False}]
    """
    import torch
    from torchrl.data.llm import History

    from ._upstream._lazy_rows import tensorclass_over, text_stack

    fields = {
        "role": text_stack([role]),
        "content": text_stack([content]),
        "is_complete": text_stack([bool(complete)]),
    }
    return tensorclass_over(History, fields, torch.Size([1]))


def _current_template(tokenizer: Any) -> Any:
    """The tokenizer's template (of named variants, the default one, as transformers picks it)."""
    template = getattr(tokenizer, "chat_template", None)
    return template.get("default") if isinstance(template, dict) else template


def _training_template(tokenizer: Any, template: str) -> str | None:
    """TRL's training variant of ``template`` (``get_training_chat_template``), or ``None``."""
    try:
        from trl.chat_template_utils import get_training_chat_template
    except ImportError:  # pragma: no cover - TRL is in the hf extra
        return None

    class _View:  # the tokenizer, seen with ``template`` as its own
        def __init__(self) -> None:
            self.chat_template = template

        def __getattr__(self, name: str) -> Any:
            return getattr(tokenizer, name)

        def apply_chat_template(self, *args: Any, **kwargs: Any) -> Any:
            kwargs.setdefault("chat_template", template)
            return tokenizer.apply_chat_template(*args, **kwargs)

    try:
        return get_training_chat_template(_View())
    except (ValueError, TypeError, AttributeError):
        return None
