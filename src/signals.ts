/**
 * The signals that stop us: the bins catch them first (start.ts), the CLI
 * while it starts and while its output drains (cli.ts), the pipeline while
 * it runs (pipeline.ts). A module of its own, importing nothing, so that the
 * bins can load it before anything else.
 */
/** A terminal hang-up is a stop too, as for a daemon (exit 0). */
export const STOP_SIGNALS: readonly NodeJS.Signals[] = ['SIGINT', 'SIGTERM', 'SIGHUP'];
