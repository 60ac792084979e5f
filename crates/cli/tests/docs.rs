//! The repository's Markdown renders as meant (CommonMark with GitHub's tables, through
//! pulldown-cmark): no table row falls out of its table into a paragraph as raw `| ... |`
//! text (the README's command table once did, split by sections inserted into it), and
//! every table has the same number of cells in each row as in its header. Every relative
//! link of the README and of `docs/` reaches a file of the repository, and an anchor
//! (`page.md#heading`) one of that page's headings, as GitHub names them; the README links
//! every page of `docs/`.

#![allow(clippy::unwrap_used)]

use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};
use std::path::Path;

fn check(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut problems = Vec::new();
    let (mut in_table, mut in_code) = (0usize, 0usize);
    let (mut head_cells, mut cells) = (0usize, 0usize);
    let mut in_head = false;
    for (event, range) in Parser::new_ext(&text, Options::ENABLE_TABLES).into_offset_iter() {
        let line = text[..range.start].matches('\n').count() + 1;
        match event {
            Event::Start(Tag::Table(_)) => in_table += 1,
            Event::End(TagEnd::Table) => in_table -= 1,
            Event::Start(Tag::CodeBlock(_)) => in_code += 1,
            Event::End(TagEnd::CodeBlock) => in_code -= 1,
            Event::Start(Tag::TableHead) => {
                in_head = true;
                head_cells = 0;
            }
            Event::End(TagEnd::TableHead) => in_head = false,
            Event::Start(Tag::TableRow) => cells = 0,
            Event::Start(Tag::TableCell) => {
                if in_head {
                    head_cells += 1;
                } else {
                    cells += 1;
                }
            }
            Event::End(TagEnd::TableRow) if cells != head_cells => problems.push(format!(
                "{}:{line}: a row of {cells} cells in a table of {head_cells}",
                path.display()
            )),
            Event::Text(t) if in_table == 0 && in_code == 0 => {
                let t = t.trim_start();
                if t.starts_with("| ") || t.starts_with("|---") {
                    problems.push(format!(
                        "{}:{line}: a table row rendered as text: {:.60}",
                        path.display(),
                        t
                    ));
                }
            }
            _ => {}
        }
    }
    problems
}

/// GitHub's anchor for a heading: lower case, spaces to `-`, punctuation other than `-`
/// and `_` dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown file's headings.
fn anchors(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut heading: Option<String> = None;
    for event in Parser::new_ext(text, Options::ENABLE_TABLES) {
        match event {
            Event::Start(Tag::Heading { .. }) => heading = Some(String::new()),
            Event::End(TagEnd::Heading(_)) => out.extend(heading.take().map(|h| slug(&h))),
            Event::Text(t) | Event::Code(t) => {
                if let Some(h) = heading.as_mut() {
                    h.push_str(&t);
                }
            }
            _ => {}
        }
    }
    out
}

/// The relative links of `path` that lead nowhere: a missing file, or a missing heading.
fn broken_links(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    let dir = path.parent().unwrap();
    let mut problems = Vec::new();
    for (event, range) in Parser::new_ext(&text, Options::ENABLE_TABLES).into_offset_iter() {
        let Event::Start(Tag::Link { dest_url, .. }) = event else {
            continue;
        };
        if dest_url.contains("://") || dest_url.starts_with("mailto:") {
            continue;
        }
        let line = text[..range.start].matches('\n').count() + 1;
        let (file, anchor) = match dest_url.split_once('#') {
            Some((f, a)) => (f, Some(a)),
            None => (dest_url.as_ref(), None),
        };
        let target = if file.is_empty() {
            path.to_path_buf()
        } else {
            dir.join(file)
        };
        if !target.exists() {
            problems.push(format!(
                "{}:{line}: link to {dest_url}: no such file",
                path.display()
            ));
            continue;
        }
        if let Some(a) = anchor {
            let t = std::fs::read_to_string(&target).unwrap_or_default();
            if !anchors(&t).iter().any(|h| h == a) {
                problems.push(format!(
                    "{}:{line}: link to {dest_url}: no heading with that anchor",
                    path.display()
                ));
            }
        }
    }
    problems
}

/// The Markdown files of the repository's root and of `docs/`.
fn markdown_files(root: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for dir in [root.to_path_buf(), root.join("docs")] {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "md") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

#[test]
fn links_reach_files_and_headings() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut problems = Vec::new();
    for path in markdown_files(&root) {
        problems.extend(broken_links(&path));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_readme_links_every_docs_page() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let pages: Vec<_> = markdown_files(&root)
        .into_iter()
        .filter(|p| p.parent().is_some_and(|d| d.ends_with("docs")))
        .collect();
    assert!(pages.len() >= 5, "docs/ holds {} pages", pages.len());
    for page in pages {
        let name = page.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            readme.contains(&format!("](docs/{name}")),
            "README does not link docs/{name}"
        );
    }
}

#[test]
fn markdown_tables_render_as_tables() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut problems = Vec::new();
    let mut checked = 0;
    for path in markdown_files(&root) {
        problems.extend(check(&path));
        checked += 1;
    }
    assert!(
        checked >= 5,
        "only {checked} Markdown files found in {}",
        root.display()
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
