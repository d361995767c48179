// Small building blocks shared by the pages. Everything from the store is rendered as text: agent outputs may hold
// HTML or scripts, and they must show, never run.
import type { ComponentChildren } from "preact";
import { useState } from "preact/hooks";
import type { ApiError } from "../api";
import { toText } from "../format";
import { href, navigate } from "../router";

export const TRUNCATE_CHARS = 4000;

export function Link(props: { to: string; children: ComponentChildren; class?: string; title?: string }) {
  return (
    <a
      href={href(props.to)}
      class={props.class}
      title={props.title}
      onClick={(e) => {
        if (e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
        e.preventDefault();
        navigate(props.to);
      }}
    >
      {props.children}
    </a>
  );
}

export function StatusBadge(props: { status: string | null | undefined }) {
  const status = props.status ?? "unknown";
  return <span class={`badge status-${status}`}>{status}</span>;
}

/** Long text cut at `limit` characters with a button showing it all. */
export function Truncated(props: { text: string; limit?: number; label?: string }) {
  const limit = props.limit ?? TRUNCATE_CHARS;
  const [all, setAll] = useState(false);
  if (props.text.length <= limit || all) {
    return (
      <>
        {props.text}
        {all && (
          <button type="button" class="link-button" onClick={() => setAll(false)}>
            show less
          </button>
        )}
      </>
    );
  }
  return (
    <>
      {props.text.slice(0, limit)}
      <span class="muted">… ({(props.text.length - limit).toLocaleString()} more characters)</span>{" "}
      <button type="button" class="link-button" onClick={() => setAll(true)} aria-label={`show all of ${props.label ?? "this text"}`}>
        show all
      </button>
    </>
  );
}

export function TextBlock(props: { value: unknown; label?: string; limit?: number }) {
  return (
    <pre class="text-block">
      <Truncated text={toText(props.value)} label={props.label} limit={props.limit} />
    </pre>
  );
}

export function KeyValues(props: { rows: Array<[string, ComponentChildren]>; label?: string }) {
  return (
    <table class="kv" aria-label={props.label}>
      <tbody>
        {props.rows.map(([key, value]) => (
          <tr key={key}>
            <th scope="row">{key}</th>
            <td>{value}</td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}

export function ErrorNote(props: { error: ApiError | null; what: string }) {
  if (!props.error || props.error.unreachable || props.error.unauthorized) return null;
  return (
    <p class="error-note" role="alert">
      Could not load {props.what}: {props.error.message}
    </p>
  );
}

export function Loading(props: { what: string }) {
  return (
    <p class="muted" aria-live="polite">
      Loading {props.what}…
    </p>
  );
}

export function NotFound(props: { title: string; children?: ComponentChildren }) {
  return (
    <section class="not-found" aria-labelledby="not-found-title">
      <h1 id="not-found-title">{props.title}</h1>
      {props.children}
      <p>
        <Link to="/rollouts">Back to the rollouts</Link>
      </p>
    </section>
  );
}

export function Pagination(props: { total: number; offset: number; limit: number; onPage: (offset: number) => void }) {
  const { total, offset, limit } = props;
  const page = Math.floor(offset / limit) + 1;
  const pages = Math.max(1, Math.ceil(total / limit));
  return (
    <nav class="pagination" aria-label="pages">
      <button type="button" disabled={page <= 1} onClick={() => props.onPage(0)} aria-label="first page">
        «
      </button>
      <button type="button" disabled={page <= 1} onClick={() => props.onPage(offset - limit)} aria-label="previous page">
        ‹ Previous
      </button>
      <span aria-live="polite">
        page {page.toLocaleString()} of {pages.toLocaleString()} · {total.toLocaleString()} rollouts
      </span>
      <button type="button" disabled={page >= pages} onClick={() => props.onPage(offset + limit)} aria-label="next page">
        Next ›
      </button>
      <button type="button" disabled={page >= pages} onClick={() => props.onPage((pages - 1) * limit)} aria-label="last page">
        »
      </button>
    </nav>
  );
}
