// The dashboard app: navigation, the connection banner, the API key prompt, and the pages.
import { Component, render, type ComponentChildren } from "preact";
import { useEffect, useState } from "preact/hooks";
import { ApiError, apiRoot, onConnection, request } from "./api";
import { retryAll } from "./hooks";
import { Link, NotFound } from "./components/common";
import { ResourcesPage } from "./pages/resources";
import { RolloutPage } from "./pages/rollout";
import { RolloutsPage } from "./pages/rollouts";
import { SettingsPage } from "./pages/settings";
import { TrainingPage } from "./pages/training";
import { WorkersPage } from "./pages/workers";
import { match, navigate, useLocation, type Location } from "./router";
import { applyTheme, loadSettings, saveToken } from "./settings";
import "./styles.css";

const NAV = [
  ["/rollouts", "Rollouts"],
  ["/resources", "Resources"],
  ["/workers", "Workers"],
  ["/training", "Training"],
  ["/settings", "Settings"],
];

function Page(props: { location: Location }) {
  const { path } = props.location;
  let m: Record<string, string> | null;
  if (path === "/" || path === "") return <Redirect to="/rollouts" />;
  if (match("/rollouts", path)) return <RolloutsPage location={props.location} />;
  if ((m = match("/rollouts/:id", path))) return <RolloutPage key={m.id} rolloutId={m.id} location={props.location} />;
  if ((m = match("/rollouts/:id/attempts/:attempt", path)))
    return <RolloutPage key={m.id} rolloutId={m.id} attemptId={m.attempt} location={props.location} />;
  if (match("/resources", path)) return <ResourcesPage location={props.location} />;
  if ((m = match("/resources/:id", path))) return <ResourcesPage location={props.location} resourcesId={m.id} />;
  if (match("/workers", path)) return <WorkersPage location={props.location} />;
  if (match("/training", path)) return <TrainingPage location={props.location} />;
  if (match("/settings", path)) return <SettingsPage />;
  return (
    <NotFound title="Page not found">
      <p>
        Nothing lives at <code>{path}</code>.
      </p>
    </NotFound>
  );
}

/** A page that fails to render (data the page did not expect) says so, and the rest of the app keeps working. */
class PageBoundary extends Component<{ children: ComponentChildren }, { error: Error | null }> {
  state = { error: null as Error | null };

  static getDerivedStateFromError(error: unknown) {
    return { error: error instanceof Error ? error : new Error(String(error)) };
  }

  componentDidCatch(error: unknown) {
    console.error("The page failed to render:", error);
  }

  render() {
    if (!this.state.error) return this.props.children;
    return (
      <NotFound title="This page could not be shown">
        <p>
          It failed on what the store answered: <code>{this.state.error.message}</code>
        </p>
        <p>
          <button type="button" onClick={() => this.setState({ error: null })}>
            Try again
          </button>
        </p>
      </NotFound>
    );
  }
}

function Redirect(props: { to: string }) {
  useEffect(() => navigate(props.to, { replace: true }), [props.to]);
  return null;
}

function ConnectionBanner(props: { error: ApiError | null; onRetry: () => void }) {
  const [countdown, setCountdown] = useState(5);
  useEffect(() => {
    if (!props.error || props.error.unauthorized) return;
    setCountdown(5);
    const timer = window.setInterval(() => {
      setCountdown((c) => {
        if (c <= 1) {
          props.onRetry();
          return 5;
        }
        return c - 1;
      });
    }, 1000);
    return () => window.clearInterval(timer);
  }, [props.error?.message]);
  if (!props.error || props.error.unauthorized) return null;
  const what = props.error.unreachable ? `Cannot reach the store at ${apiRoot()}.` : `The store answered with an error: ${props.error.message}`;
  return (
    <div class="banner" role="alert">
      <span>
        {what} Retrying in {countdown} s.
      </span>
      <button type="button" onClick={props.onRetry}>
        Retry now
      </button>
    </div>
  );
}

function TokenPrompt(props: { onSaved: () => void }) {
  const [token, setToken] = useState("");
  const [remember, setRemember] = useState(false);
  return (
    <div class="overlay">
      <form
        class="dialog"
        role="dialog"
        aria-modal="true"
        aria-labelledby="token-title"
        onSubmit={(e) => {
          e.preventDefault();
          saveToken(token.trim(), remember);
          props.onSaved();
        }}
      >
        <h2 id="token-title">This store needs an API key</h2>
        <p>
          The store at <span class="mono">{apiRoot()}</span> was started with <code>--api-key</code>. Enter the key to see its data; it is sent
          in the Authorization header, never in a URL.
        </p>
        <label>
          API key
          <input type="password" autoComplete="off" value={token} onInput={(e) => setToken((e.target as HTMLInputElement).value)} autoFocus />
        </label>
        <label class="inline">
          <input type="checkbox" checked={remember} onChange={() => setRemember(!remember)} /> Remember in this browser
        </label>
        <div class="filter-actions">
          <button type="submit" disabled={!token.trim()}>
            Use this key
          </button>
        </div>
      </form>
    </div>
  );
}

function App() {
  const location = useLocation();
  const [connection, setConnection] = useState<ApiError | null>(null);
  const [epoch, setEpoch] = useState(0);
  useEffect(() => onConnection(setConnection), []);
  useEffect(() => {
    applyTheme(loadSettings().theme);
  }, []);
  const retry = () => {
    request("GET", "statistics").catch(() => undefined);
    retryAll();
  };
  const section = "/" + (location.path.split("/")[1] ?? "");
  return (
    <>
      <a href="#main" class="skip">
        Skip to content
      </a>
      <header class="top">
        <span class="brand">
          <span aria-hidden="true">⚡</span> agentbolt
        </span>
        <nav aria-label="main">
          <ul>
            {NAV.map(([to, label]) => (
              <li key={to}>
                <Link to={to} class={section === to ? "active" : ""}>
                  {label}
                </Link>
              </li>
            ))}
          </ul>
        </nav>
      </header>
      <ConnectionBanner error={connection} onRetry={retry} />
      {connection?.unauthorized && (
        <TokenPrompt
          onSaved={() => {
            setConnection(null);
            setEpoch((e) => e + 1);
          }}
        />
      )}
      <main id="main" tabIndex={-1}>
        <PageBoundary key={`${epoch}:${location.path}`}>
          <Page location={location} />
        </PageBoundary>
      </main>
    </>
  );
}

const root = document.getElementById("app")!;
root.textContent = ""; // the boot message
render(<App />, root);
