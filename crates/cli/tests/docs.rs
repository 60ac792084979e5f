//! The repository's Markdown renders as meant (CommonMark with GitHub's tables, through
//! pulldown-cmark): no table row falls out of its table into a paragraph as raw `| ... |`
//! text (the README's command table once did, split by sections inserted into it), and
//! every table has the same number of cells in each row as in its header.

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

#[test]
fn markdown_tables_render_as_tables() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut problems = Vec::new();
    let mut checked = 0;
    for entry in std::fs::read_dir(&root).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            problems.extend(check(&path));
            checked += 1;
        }
    }
    assert!(
        checked >= 5,
        "only {checked} Markdown files found in {}",
        root.display()
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
