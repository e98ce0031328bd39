/**
 * The service's failures as one error class carrying its code.
 *
 * Every answer that is not a success has the shape `{"code", "message"}`; `code` is one of the
 * contract's codes (`invalid`, `not_found`, `unauthenticated`, `rate_limited`...). A request
 * that got no answer is `timeout` or `transfer_failed`, with status 0.
 */
export class AgentboxError extends Error {
  /** One of the contract's codes: branch on it, never on the message. */
  readonly code: string;
  /** The HTTP status (0: the service never answered). */
  readonly status: number;
  /** The seconds a 429 asks to wait. */
  readonly retryAfter: number | undefined;

  constructor(code: string, message: string, status: number, retryAfter?: number) {
    super(`${code}: ${message}`);
    this.name = "AgentboxError";
    this.code = code;
    this.status = status;
    this.retryAfter = retryAfter;
  }

  /** What was wrong and why, without the code. */
  get reason(): string {
    return this.message.slice(this.code.length + 2);
  }
}

/** The error a failed answer carries. */
export function errorOf(
  status: number,
  body: string,
  retryAfter: string | undefined,
  what: string,
): AgentboxError {
  let code = "unknown";
  let message = `${what}: the service answered ${status} without its error shape`;
  try {
    const parsed = JSON.parse(body) as { code?: unknown; message?: unknown };
    if (typeof parsed.code === "string" && typeof parsed.message === "string") {
      code = parsed.code;
      message = parsed.message;
    }
  } catch {
    // Not JSON: the message above says so.
  }
  const retry =
    retryAfter !== undefined && /^\d+$/.test(retryAfter) ? Number(retryAfter) : undefined;
  return new AgentboxError(code, message, status, retry);
}
