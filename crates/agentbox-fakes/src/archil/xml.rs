//! The little XML the object API speaks: escaping what it writes, and reading the one body
//! it is sent, DeleteObjects' `<Delete><Object><Key>..</Key></Object>..<Quiet>..</Quiet></Delete>`
//! (`_s3xml.build_delete_request`).
//!
//! quick-xml reads the body (the crate the Archil provider reads S3's answers with): it
//! tokenizes, matches end tags to start tags, checks comments and attributes, and splits out
//! entity and character references, which are decoded here. What is around it is bounded
//! (the body's size is capped before it is read, nesting at [`MAX_DEPTH`], keys at
//! [`MAX_KEYS`]), takes comments, processing instructions, CDATA, namespace prefixes and
//! attributes as XML has them, decodes the five named entities and numeric references,
//! normalizes line ends as XML 1.0 does, and refuses anything else (a DTD, an unknown
//! entity, a mismatched tag, a declaration that does not open the body) as S3 does,
//! `MalformedXML`. Writing is by hand: [`escape`] is all it takes.

use quick_xml::Reader;
use quick_xml::events::{BytesRef, BytesStart, Event};

/// How deep elements may nest in a Delete body.
const MAX_DEPTH: usize = 8;
/// The most keys one DeleteObjects request may name (S3's own bound).
pub(crate) const MAX_KEYS: usize = 1000;
/// The most characters of a name from the body an error repeats.
const SHOWN: usize = 64;

/// Text for element content (and attribute values): `&`, `<`, `>`, `"` and `'` escaped.
pub(crate) fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

/// Whether XML 1.0 can carry `s` at all (no control characters but tab, newline and return;
/// no U+FFFE or U+FFFF). A name that cannot be written is left out of a listing.
pub(crate) fn writable(s: &str) -> bool {
    s.chars()
        .all(|c| matches!(c, '\t' | '\n' | '\r') || (c >= ' ' && c != '\u{FFFE}' && c != '\u{FFFF}'))
}

/// A DeleteObjects body as read.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct DeleteRequest {
    pub(crate) keys: Vec<String>,
    pub(crate) quiet: bool,
}

/// Read a `<Delete>` body; the error says what is malformed, and at which byte when it is at one
/// (not when the body as a whole lacks something).
pub(crate) fn parse_delete(body: &str) -> Result<DeleteRequest, String> {
    let mut reader = Reader::from_str(body);
    // End names are checked by default; `--` inside a comment is refused as XML refuses it.
    reader.config_mut().check_comments = true;
    let mut read = Reading::default();
    loop {
        let event = reader.read_event().map_err(|e| {
            format!(
                "{} (at byte {})",
                shown(&e.to_string(), 4 * SHOWN),
                reader.error_position()
            )
        })?;
        let eof = matches!(event, Event::Eof);
        read.take(event)
            .map_err(|why| format!("{why} (by byte {})", reader.buffer_position()))?;
        if eof {
            return read.finish();
        }
    }
}

/// What has been read of a Delete body so far.
#[derive(Default)]
struct Reading {
    /// The open elements' local names, the root first; never deeper than [`MAX_DEPTH`].
    stack: Vec<String>,
    /// The character data since the last tag.
    text: String,
    keys: Vec<String>,
    quiet: bool,
    seen_root: bool,
    /// Whether anything at all has been read (an XML declaration must come first).
    seen_any: bool,
}

impl Reading {
    fn take(&mut self, event: Event<'_>) -> Result<(), String> {
        let first = !std::mem::replace(&mut self.seen_any, true);
        match event {
            Event::Decl(d) => {
                if !first {
                    return Err("an XML declaration that does not open the body".into());
                }
                d.version().map_err(|e| format!("the XML declaration: {e}"))?;
            }
            Event::PI(_) | Event::Comment(_) | Event::Eof => {}
            Event::DocType(_) => return Err("a DTD (not accepted)".into()),
            Event::Start(e) => {
                let name = self.open(&e)?;
                if self.stack.len() >= MAX_DEPTH {
                    return Err(format!("elements nested deeper than {MAX_DEPTH}"));
                }
                self.stack.push(name);
            }
            Event::Empty(e) => {
                // `<Key/>` is `<Key></Key>`: an element with no text.
                let name = self.open(&e)?;
                self.close(&name)?;
                self.text.clear();
            }
            Event::End(e) => {
                // quick-xml has matched it to its start tag already; this only keeps a slip from
                // going unseen.
                let name = String::from_utf8_lossy(e.local_name().as_ref()).into_owned();
                let open = self
                    .stack
                    .pop()
                    .ok_or_else(|| format!("</{}> closes nothing", shown(&name, SHOWN)))?;
                if open != name {
                    return Err(format!("</{}> closes <{}>", shown(&name, SHOWN), shown(&open, SHOWN)));
                }
                self.close(&name)?;
                self.text.clear();
            }
            Event::Text(t) => {
                let t = t.xml10_content().map_err(|e| e.to_string())?;
                if self.stack.is_empty() {
                    if !t.trim_matches(is_xml_space).is_empty() {
                        return Err("text outside the root element".into());
                    }
                } else {
                    self.text.push_str(&t);
                }
            }
            Event::CData(c) => {
                if self.stack.is_empty() {
                    return Err("CDATA outside the root element".into());
                }
                self.text.push_str(&c.xml10_content().map_err(|e| e.to_string())?);
            }
            Event::GeneralRef(r) => {
                if self.stack.is_empty() {
                    return Err("a reference outside the root element".into());
                }
                self.text.push(reference(&r)?);
            }
        }
        Ok(())
    }

    /// A start or empty-element tag: its local name, once its place and attributes are checked.
    fn open(&mut self, e: &BytesStart<'_>) -> Result<String, String> {
        let name = String::from_utf8_lossy(e.local_name().as_ref()).into_owned();
        if name.is_empty() {
            return Err("a tag with no name".into());
        }
        if self.stack.is_empty() {
            if self.seen_root {
                return Err("a second root element".into());
            }
            if name != "Delete" {
                return Err(format!("the root element is <{}>, not <Delete>", shown(&name, SHOWN)));
            }
            self.seen_root = true;
        }
        for a in e.attributes() {
            a.map_err(|why| format!("an attribute of <{}>: {why}", shown(&name, SHOWN)))?;
        }
        self.text.clear();
        Ok(name)
    }

    /// An element has closed, `name` inside what is still open on the stack.
    fn close(&mut self, name: &str) -> Result<(), String> {
        let path: Vec<&str> = self.stack.iter().map(String::as_str).collect();
        match (path.as_slice(), name) {
            (["Delete", "Object"], "Key") => {
                if self.keys.len() >= MAX_KEYS {
                    return Err(format!("more than {MAX_KEYS} keys"));
                }
                self.keys.push(std::mem::take(&mut self.text));
            }
            (["Delete"], "Quiet") => {
                self.quiet = match self.text.trim_matches(is_xml_space) {
                    "true" => true,
                    "false" => false,
                    other => return Err(format!("<Quiet> is true or false, not {:?}", shown(other, SHOWN))),
                };
            }
            _ => {}
        }
        Ok(())
    }

    fn finish(self) -> Result<DeleteRequest, String> {
        if !self.stack.is_empty() {
            let open: Vec<String> = self.stack.iter().map(|n| shown(n, SHOWN)).collect();
            return Err(format!("<{}> is never closed", open.join("><")));
        }
        if !self.seen_root {
            return Err("no <Delete> element".into());
        }
        if self.keys.is_empty() {
            return Err("no <Object><Key> in <Delete>".into());
        }
        Ok(DeleteRequest {
            keys: self.keys,
            quiet: self.quiet,
        })
    }
}

/// The character an entity or character reference stands for: XML's five named entities
/// and `&#..;`/`&#x..;`, no others (a body has no DTD to declare them in).
fn reference(r: &BytesRef<'_>) -> Result<char, String> {
    let name = r.decode().map_err(|e| e.to_string())?;
    Ok(match name.as_ref() {
        "amp" => '&',
        "lt" => '<',
        "gt" => '>',
        "quot" => '"',
        "apos" => '\'',
        _ => match r.resolve_char_ref() {
            Ok(Some(c)) => c,
            Ok(None) => {
                return Err(format!(
                    "the entity &{}; (only XML's own five are known)",
                    shown(&name, SHOWN)
                ));
            }
            Err(e) => return Err(format!("&{}; is no character: {e}", shown(&name, SHOWN))),
        },
    })
}

/// XML's whitespace: space, tab, newline and return (not all of Unicode's).
fn is_xml_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r')
}

/// A name or text from the body, cut short to at most `max` characters to be repeated in an
/// error.
fn shown(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As `_s3xml.build_delete_request(["a&b", "<c>", "d/e"], True)` writes it.
    const SDK_BODY: &str = r#"<?xml version="1.0" encoding="UTF-8"?><Delete><Object><Key>a&amp;b</Key></Object><Object><Key>&lt;c&gt;</Key></Object><Object><Key>d/e</Key></Object><Quiet>true</Quiet></Delete>"#;

    fn keys(body: &str) -> Vec<String> {
        parse_delete(body).unwrap_or_else(|e| panic!("{body}: {e}")).keys
    }

    fn one_key(inner: &str) -> String {
        let mut k = keys(&format!("<Delete><Object><Key>{inner}</Key></Object></Delete>"));
        assert_eq!(k.len(), 1);
        k.remove(0)
    }

    #[test]
    fn the_sdks_delete_body_reads_back() {
        assert_eq!(
            parse_delete(SDK_BODY).unwrap(),
            DeleteRequest {
                keys: vec!["a&b".into(), "<c>".into(), "d/e".into()],
                quiet: true
            }
        );
        let ns = r#"<Delete xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><!-- c --><Object><Key><![CDATA[x<y]]>&#233;&#x41;</Key><VersionId>v</VersionId></Object></Delete>"#;
        assert_eq!(keys(ns), vec!["x<yéA".to_string()]);
        // Prefixed names, whitespace between elements, a quiet that is false, a BOM.
        let prefixed = "\u{FEFF}<?xml version='1.0'?>\n<s3:Delete xmlns:s3='http://s3.amazonaws.com/doc/2006-03-01/'>\n  <s3:Object> <s3:Key>k</s3:Key> </s3:Object>\n  <s3:Quiet> false </s3:Quiet>\n</s3:Delete>\n";
        assert_eq!(
            parse_delete(prefixed).unwrap(),
            DeleteRequest {
                keys: vec!["k".into()],
                quiet: false
            }
        );
        // An empty key is read as one (check_key refuses it later, per key).
        assert_eq!(
            keys("<Delete><Object><Key/></Object><Object><Key></Key></Object></Delete>"),
            vec![""; 2]
        );
    }

    #[test]
    fn references_are_decoded() {
        assert_eq!(one_key("&amp;&lt;&gt;&quot;&apos;"), "&<>\"'");
        assert_eq!(one_key("a&#38;b&#x26;c"), "a&b&c");
        assert_eq!(one_key("&#x1F600;&#128512;"), "\u{1F600}\u{1F600}");
        // `&amp;lt;` is the text `&lt;`, not `<`: references are decoded once.
        assert_eq!(one_key("&amp;lt;"), "&lt;");
        // A return written as a reference is kept; a literal one is a line end, as XML has it.
        assert_eq!(one_key("a&#13;&#10;b"), "a\r\nb");
        assert_eq!(one_key("a\r\nb\rc"), "a\nb\nc");
        // Comments and processing instructions inside the text are not part of it.
        assert_eq!(one_key("a<!-- x -->b<?pi y?>c"), "abc");
        // Quotes and `>` are only text in text.
        assert_eq!(one_key(r#"a"b'c>d"#), r#"a"b'c>d"#);
    }

    #[test]
    fn cdata_is_taken_as_it_is() {
        assert_eq!(one_key("<![CDATA[a&amp;<b>]]>"), "a&amp;<b>");
        assert_eq!(one_key("x<![CDATA[]]>y<![CDATA[&]]>&amp;"), "xy&&");
        assert_eq!(one_key("<![CDATA[]]]]><![CDATA[>]]>"), "]]>");
    }

    #[test]
    fn malformed_bodies_are_refused() {
        for (body, why) in [
            ("", "no <Delete>"),
            ("  \n", "no <Delete>"),
            ("<!-- only -->", "no <Delete>"),
            ("<Delete></Delete>", "no <Object>"),
            ("<Delete/>", "no <Object>"),
            ("<Delete><Object><Key>a</Object></Delete>", "expected `</Key>`"),
            ("<Delete><a:Key></b:Key></Delete>", "expected `</a:Key>`"),
            ("<Delete></Object></Delete>", "expected `</Delete>`"),
            (
                "<Delete><Object><Key>a</Key></Object></Delete></Delete>",
                "does not match any open tag",
            ),
            ("<Other/>", "root element"),
            ("<Other><Object><Key>a</Key></Object></Other>", "root element"),
            ("<Delete><Object><Key>a</Key></Object></Delete><Delete/>", "second root"),
            ("<!DOCTYPE x><Delete/>", "DTD"),
            (
                "<!DOCTYPE d [<!ENTITY e \"x\">]><Delete><Object><Key>&e;</Key></Object></Delete>",
                "DTD",
            ),
            (
                "<Delete><!ELEMENT x ANY><Object><Key>a</Key></Object></Delete>",
                "markup",
            ),
            ("<Delete><Object><Key>&bogus;</Key></Object></Delete>", "entity"),
            ("<Delete><Object><Key>&;</Key></Object></Delete>", "entity"),
            ("<Delete><Object><Key>&AMP;</Key></Object></Delete>", "entity"),
            (
                "<Delete><Object><Key>a & b</Key></Object></Delete>",
                "reference not closed",
            ),
            (
                "<Delete><Object><Key>a &amp b</Key></Object></Delete>",
                "reference not closed",
            ),
            ("<Delete><Object><Key>&#0;</Key></Object></Delete>", "no character"),
            ("<Delete><Object><Key>&#xD800;</Key></Object></Delete>", "no character"),
            (
                "<Delete><Object><Key>&#x110000;</Key></Object></Delete>",
                "no character",
            ),
            ("<Delete><Object><Key>&#X41;</Key></Object></Delete>", "no character"),
            ("<Delete><Object><Key>&#-65;</Key></Object></Delete>", "no character"),
            ("<Delete><Object><Key>&#;</Key></Object></Delete>", "no character"),
            ("<Delete><Object><Key>&#x;</Key></Object></Delete>", "no character"),
            ("x<Delete><Object><Key>a</Key></Object></Delete>", "text outside"),
            ("<Delete><Object><Key>a</Key></Object></Delete>x", "text outside"),
            (
                "&amp;<Delete><Object><Key>a</Key></Object></Delete>",
                "outside the root",
            ),
            (
                "<![CDATA[a]]><Delete><Object><Key>a</Key></Object></Delete>",
                "CDATA outside",
            ),
            (
                " <?xml version=\"1.0\"?><Delete><Object><Key>a</Key></Object></Delete>",
                "declaration",
            ),
            (
                "<Delete><?xml version=\"1.0\"?><Object><Key>a</Key></Object></Delete>",
                "declaration",
            ),
            (
                "<?xml encoding=\"UTF-8\"?><Delete><Object><Key>a</Key></Object></Delete>",
                "declaration",
            ),
            ("<Delete><!-- a -- b --><Object><Key>a</Key></Object></Delete>", "`--`"),
            (
                "<Delete a=\"1\" a=\"2\"><Object><Key>a</Key></Object></Delete>",
                "attribute",
            ),
            ("<Delete a=1><Object><Key>a</Key></Object></Delete>", "attribute"),
            ("<Delete a><Object><Key>a</Key></Object></Delete>", "attribute"),
            ("<><Delete><Object><Key>a</Key></Object></Delete>", "no name"),
            (
                "<Delete><Quiet>maybe</Quiet><Object><Key>a</Key></Object></Delete>",
                "Quiet",
            ),
            ("<Delete><Quiet/><Object><Key>a</Key></Object></Delete>", "Quiet"),
        ] {
            let e = parse_delete(body).unwrap_err();
            assert!(e.contains(why), "{body}: {e}");
        }
        // An error says where it was found.
        let e = parse_delete("<Delete><Object><Key>&bogus;</Key></Object></Delete>").unwrap_err();
        assert!(e.ends_with("(by byte 28)"), "{e}");
        let e = parse_delete("<Delete><Object><Key>a</Object></Delete>").unwrap_err();
        assert!(e.ends_with("(at byte 22)"), "{e}");
    }

    #[test]
    fn truncated_bodies_are_refused() {
        // Every proper prefix of a good body is refused, and none panics.
        for end in 0..SDK_BODY.len() {
            let body = &SDK_BODY[..end];
            assert!(parse_delete(body).is_err(), "{body}");
        }
        for (body, why) in [
            ("<Delete><Object><Key>a", "<Delete><Object><Key> is never closed"),
            ("<Delete><Object><Key>a</Key", "tag not closed"),
            ("<Delete><Object><Key", "tag not closed"),
            ("<Delete><Object><Key>&amp", "reference not closed"),
            ("<Delete><Object><Key><![CDATA[a", "CDATA not closed"),
            ("<Delete><!-- a", "comment not closed"),
            ("<?xml version=\"1.0\"", "not closed"),
            ("<!DOCTYPE", "DOCTYPE not closed"),
        ] {
            let e = parse_delete(body).unwrap_err();
            assert!(e.contains(why), "{body}: {e}");
        }
    }

    #[test]
    fn no_input_panics() {
        // Each byte of a body that says most of what a body can, changed to each of the
        // characters markup is made of (and a few that are not), then cut after it.
        let body = r#"<?xml version="1.0"?><!--c--><Delete xmlns="u" a='b'><Object><Key>a&amp;&#65;<![CDATA[c]]><?p q?></Key></Object><Quiet>true</Quiet></Delete>"#;
        let marks = b"<>&;#x/!?-[]\"'= :\0\xff";
        let mut runs = 0;
        for i in 0..body.len() {
            for &m in marks {
                let mut b = body.as_bytes().to_vec();
                b[i] = m;
                for end in [i + 1, b.len()] {
                    if let Ok(s) = std::str::from_utf8(&b[..end]) {
                        let _ = parse_delete(s);
                        runs += 1;
                    }
                }
            }
        }
        assert!(runs > 1000);
    }

    #[test]
    fn the_bounds_hold() {
        let objects = |n: usize| -> String { (0..n).map(|i| format!("<Object><Key>{i}</Key></Object>")).collect() };
        assert_eq!(keys(&format!("<Delete>{}</Delete>", objects(MAX_KEYS))).len(), MAX_KEYS);
        let e = parse_delete(&format!("<Delete>{}</Delete>", objects(MAX_KEYS + 1))).unwrap_err();
        assert!(e.contains(&format!("more than {MAX_KEYS} keys")), "{e}");
        // Keys under some other path are no keys, and not counted.
        assert_eq!(
            keys(&format!(
                "<Delete>{}<Object><Key>k</Key></Object></Delete>",
                "<Key>x</Key>".repeat(MAX_KEYS + 1)
            )),
            vec!["k".to_string()]
        );

        // <Delete> and MAX_DEPTH - 1 more are read; one more is refused.
        let nested = |n: usize| format!("{}{}", "<a>".repeat(n), "</a>".repeat(n));
        let fits = format!(
            "<Delete><Object><Key>k</Key></Object>{}</Delete>",
            nested(MAX_DEPTH - 1)
        );
        assert_eq!(keys(&fits), vec!["k".to_string()]);
        let deep = format!("<Delete><Object><Key>k</Key></Object>{}</Delete>", nested(MAX_DEPTH));
        assert!(parse_delete(&deep).unwrap_err().contains("deeper"));
        let unclosed = "<a>".repeat(100_000);
        assert!(
            parse_delete(&format!("<Delete>{unclosed}"))
                .unwrap_err()
                .contains("deeper")
        );
        // Empty elements do not nest.
        let flat = format!(
            "<Delete>{}<Object><Key>k</Key></Object></Delete>",
            "<a/>".repeat(10_000)
        );
        assert_eq!(keys(&flat), vec!["k".to_string()]);
    }

    #[test]
    fn errors_repeat_only_a_little_of_the_body() {
        let long = "x".repeat(100_000);
        let e = parse_delete(&format!("<{long}/>")).unwrap_err();
        assert!(e.contains("not <Delete>") && e.len() < 300, "{}", e.len());
        let e = parse_delete(&format!("<Delete><Object><Key>&{long};</Key></Object></Delete>")).unwrap_err();
        assert!(e.contains("entity") && e.len() < 300, "{}", e.len());
        let e = parse_delete(&format!("<Delete><{long}></x></Delete>")).unwrap_err();
        assert!(e.contains("expected `</xxx") && e.len() < 300, "{}", e.len());
        let e = parse_delete(&format!("<Delete><{long}>")).unwrap_err();
        assert!(e.contains("never closed") && e.len() < 300, "{}", e.len());
        let e = parse_delete(&format!("<Delete><Quiet>{long}</Quiet></Delete>")).unwrap_err();
        assert!(e.contains("Quiet") && e.len() < 300, "{}", e.len());
    }

    #[test]
    fn escaping_and_what_xml_can_carry() {
        assert_eq!(escape(r#"a&<>"'"#), "a&amp;&lt;&gt;&quot;&apos;");
        assert!(writable("tab\there é"));
        assert!(!writable("bell\u{7}"));
        // What is escaped reads back as it was.
        let k = "a&b<c>d\"e'f&amp;";
        assert_eq!(one_key(&escape(k)), k);
    }
}
