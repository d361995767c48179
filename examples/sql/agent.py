"""The sql agent: a LangGraph workflow that writes, executes, checks and rewrites a SQLite query.

```text
START -> write_query -> execute_query --(no rewrite left)--> END
                              ^           |
                              |      check_query --(THE QUERY IS CORRECT)--> END
                              |           |
                              +--- rewrite_query <--(the checker found a problem)
```

Each LLM node is a LangChain ``ChatOpenAI`` call whose requests carry the node's name in the
``x-agentbolt-agent-name`` header, so the gateway records which node made each call and GRPO can train only some of
them (``agent_match="write"`` trains ``write_query`` and ``rewrite_query``, as the reference example does; the
checker shares the weights but its calls are not trained on). The reward is execution accuracy.
"""

from __future__ import annotations

import re
import sqlite3
from typing import Any, Dict, List, TypedDict

import agentbolt as agl
from examples.common.rewards import check_format_credit
from examples.sql.databases import SqlTask, execute, execution_match, schema_text

__all__ = [
    "AGENT_MATCH",
    "CHECK_PROMPT",
    "WRITE_PROMPT",
    "SqlAgent",
    "SqlState",
    "build_graph",
    "extract_query",
    "format_result",
    "writer_messages",
]

AGENT_MATCH = "write"
"""The nodes GRPO trains: ``write_query`` and ``rewrite_query``."""

WRITE_PROMPT = (
    "You write one SQLite query that answers the question. Use only the table and columns of the schema. Reply "
    "with the query alone in a ```sql block."
)
CHECK_PROMPT = (
    "You check a SQLite query. If the result answers the question, reply exactly 'THE QUERY IS CORRECT'. "
    "Otherwise say in one sentence what is wrong."
)
CORRECT = "THE QUERY IS CORRECT"

_EXAMPLE_SCHEMA = "CREATE TABLE ships (id INTEGER PRIMARY KEY, name TEXT, port TEXT, tons INTEGER);"
_EXAMPLE_PAIRS = (
    ("How many ships have port Bergen?", "SELECT COUNT(*) FROM ships WHERE port = 'Bergen'"),
    ("Which ship has the highest tons? Give its name.", "SELECT name FROM ships ORDER BY tons DESC LIMIT 1"),
    ("What is the lowest tons of all ships?", "SELECT MIN(tons) FROM ships"),
    ("What is the port of the ship named Nordlys?", "SELECT port FROM ships WHERE name = 'Nordlys'"),
    ("List the names of the ships whose tons is less than 500.", "SELECT name FROM ships WHERE tons < 500"),
)


def _question_turn(schema: str, question: str) -> str:
    return f"Schema: {schema}\nQuestion: {question}"


def writer_messages(content: str) -> List[Dict[str, str]]:
    """The query writer's conversation: one worked example per kind of question, then ``content``.

    The examples use a table that is in no database of the example. The instruction opens the first user turn, so
    the conversation is the same for the writer and the rewriter.
    """
    messages: List[Dict[str, str]] = []
    for question, query in _EXAMPLE_PAIRS:
        messages.append({"role": "user", "content": _question_turn(_EXAMPLE_SCHEMA, question)})
        messages.append({"role": "assistant", "content": f"```sql\n{query}\n```"})
    messages.append({"role": "user", "content": content})
    messages[0] = {"role": "user", "content": f"{WRITE_PROMPT}\n\n{messages[0]['content']}"}
    return messages


_FENCED = re.compile(r"```(?:sql)?\s*(.*?)(?:```|$)", re.DOTALL | re.IGNORECASE)
_SELECT = re.compile(r"\b(SELECT|WITH)\b.*", re.DOTALL | re.IGNORECASE)


def extract_query(text: str) -> str:
    """The SQL in a reply: the first ```sql block, else the text from the first SELECT/WITH; one statement."""
    fenced = _FENCED.search(text)
    body = fenced.group(1) if fenced else text
    found = _SELECT.search(body)
    query = found.group(0) if found else body
    return query.strip().split(";")[0].strip()


def format_result(db_id: str, query: str, limit: int = 5) -> str:
    """What executing ``query`` shows the checker: a few rows, or the error."""
    if not query:
        return "Error: no query"
    try:
        rows = execute(db_id, query)
    except (sqlite3.Error, sqlite3.Warning) as exc:
        return f"Error: {exc}"
    shown = ", ".join(str(row if len(row) > 1 else row[0]) for row in rows[:limit])
    more = f" ... ({len(rows)} rows)" if len(rows) > limit else ""
    return f"[{shown}{more}]" if rows else "no rows"


class SqlState(TypedDict, total=False):
    """The graph's state."""

    db_id: str
    question: str
    query: str
    result: str
    feedback: str
    turn: int
    done: bool


def build_graph(llm: agl.LLM, base_url: str, *, max_turns: int = 1, max_tokens: int = 64) -> Any:
    """Compile the LangGraph workflow against an OpenAI-compatible endpoint.

    Args:
        llm: The model resource (its model name and sampling parameters are used).
        base_url: The endpoint (the rollout's gateway URL during training).
        max_turns: Rewrite rounds allowed after the first query.
        max_tokens: Completion budget of each call.
    """
    from langchain_openai import ChatOpenAI
    from langgraph.graph import END, START, StateGraph

    sampling = dict(llm.sampling_parameters or {})
    temperature = float(sampling.pop("temperature", 0.0))
    budget = int(sampling.pop("max_tokens", max_tokens))

    def model(node: str) -> Any:
        return ChatOpenAI(
            base_url=base_url, api_key=llm.api_key or "unused", model=llm.model, temperature=temperature,
            max_completion_tokens=budget, max_retries=0, default_headers={"x-agentbolt-agent-name": node},
        )  # fmt: skip

    writer, checker, rewriter = model("write_query"), model("check_query"), model("rewrite_query")

    def ask(chat: Any, messages: List[Dict[str, str]]) -> str:
        # A model may write a lone surrogate, which a request body cannot carry: it goes as a backslash escape. The
        # query itself is kept as written, so it fails to run and earns nothing.
        sendable = [{**m, "content": m["content"].encode("utf-8", "backslashreplace").decode()} for m in messages]
        return str(chat.invoke(sendable).content or "")

    def write_query(state: SqlState) -> SqlState:
        content = _question_turn(schema_text(state["db_id"]), state["question"])
        return {"query": extract_query(ask(writer, writer_messages(content))), "turn": 0}

    def execute_query(state: SqlState) -> SqlState:
        return {"result": format_result(state["db_id"], state["query"])}

    def check_query(state: SqlState) -> SqlState:
        content = f"Question: {state['question']}\nQuery: {state['query']}\nResult: {state['result']}"
        feedback = ask(checker, [{"role": "system", "content": CHECK_PROMPT}, {"role": "user", "content": content}])
        return {"feedback": feedback, "done": CORRECT in feedback.upper()}

    def rewrite_query(state: SqlState) -> SqlState:
        content = (
            f"{_question_turn(schema_text(state['db_id']), state['question'])}\n"
            f"Previous query: {state['query']}\nResult: {state['result']}\nProblem: {state['feedback']}"
        )
        query = extract_query(ask(rewriter, writer_messages(content)))
        return {"query": query, "turn": state.get("turn", 0) + 1}

    builder = StateGraph(SqlState)
    for node in (write_query, execute_query, check_query, rewrite_query):
        builder.add_node(node.__name__, node)
    builder.add_edge(START, "write_query")
    builder.add_edge("write_query", "execute_query")
    builder.add_conditional_edges("execute_query", lambda s: END if s.get("turn", 0) >= max_turns else "check_query")
    builder.add_conditional_edges("check_query", lambda s: END if s.get("done") else "rewrite_query")
    builder.add_edge("rewrite_query", "execute_query")
    return builder.compile()


class SqlAgent(agl.LitAgent[SqlTask]):
    """The sql agent as a ``LitAgent``: one graph run per rollout, rewarded by execution accuracy.

    Args:
        max_turns: Rewrite rounds after the first query.
        max_tokens: Completion budget per call.
        format_credit: Training-only credit for a query that runs without error but returns other rows.
    """

    def __init__(self, *, max_turns: int = 1, max_tokens: int = 64, format_credit: float = 0.1) -> None:
        super().__init__()
        self.max_turns = max_turns
        self.max_tokens = max_tokens
        self.format_credit = check_format_credit(format_credit)

    def _final_query(self, task: SqlTask, resources: agl.NamedResources, rollout: agl.Rollout) -> str:
        llm = resources.get("main_llm")
        if not isinstance(llm, agl.LLM):
            raise TypeError(f"the sql agent needs an LLM resource named 'main_llm', got {type(llm).__name__}")
        attempt_id = rollout.attempt.attempt_id if isinstance(rollout, agl.AttemptedRollout) else None
        graph = build_graph(llm, llm.get_base_url(rollout.rollout_id, attempt_id), max_turns=self.max_turns,
                            max_tokens=self.max_tokens)  # fmt: skip
        state = graph.invoke({"db_id": task["db_id"], "question": task["question"]}, {"recursion_limit": 20})
        return str(state.get("query") or "")

    def training_rollout(self, task: SqlTask, resources: agl.NamedResources, rollout: agl.Rollout) -> float:
        """A training run: 1 for the gold rows, the format credit for a query that runs, else 0."""
        query = self._final_query(task, resources, rollout)
        if execution_match(query, task["query"], task["db_id"]):
            return 1.0
        return self.format_credit if not format_result(task["db_id"], query).startswith("Error") else 0.0

    def validation_rollout(self, task: SqlTask, resources: agl.NamedResources, rollout: agl.Rollout) -> float:
        """A held-out run: execution accuracy (1 or 0)."""
        return float(execution_match(self._final_query(task, resources, rollout), task["query"], task["db_id"]))
