// The page imports xterm.js from where the server serves it; its types are the package's.
export * from "@xterm/xterm";
