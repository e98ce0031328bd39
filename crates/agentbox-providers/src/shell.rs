//! Words for `sh`: what a box's shell is given when a provider (or a runner of protocol 2)
//! has no argv to pass, only a command line.

/// `s` as one word of `sh`: in single quotes, each `'` closed, escaped and opened again
/// (`it's` is `'it'\''s'`).
pub(crate) fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// `argv` as one command line of `sh`, each word quoted.
pub(crate) fn command_line(argv: &[String]) -> String {
    argv.iter().map(|w| quote(w)).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_word_comes_back_as_it_was() {
        let argv: Vec<String> = ["printf", "%s|", "it's", "a b", "$HOME", "", "\\n"]
            .map(String::from)
            .to_vec();
        let out = std::process::Command::new("sh")
            .args(["-c", &command_line(&argv)])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8(out.stdout).unwrap(), "it's|a b|$HOME||\\n|");
    }
}
