// The fit addon, as the server serves it; its types are the package's.
export * from "@xterm/addon-fit";
