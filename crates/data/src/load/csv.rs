//! CSV with a header row (plain-text columns only), comma- or tab-separated.

use std::path::Path;

use super::{
    COMPLETION, Columns, LABEL, LineIndex, LoadOptions, PreferenceRow, Reading, Rows, Text, build_row,
    build_unpaired_row,
};
use crate::error::{DataError, RowProblem};

/// CSV: a header row naming the columns, then one record per row (plain text only). Line numbers
/// are physical lines (header = line 1; a record with a quoted newline is numbered by its first
/// line).
pub(super) fn read_csv(bytes: &[u8], delimiter: u8, opts: &LoadOptions, rows: &mut Rows) -> Result<(), DataError> {
    let cols = &opts.columns;
    let path = &rows.path.clone();
    let lines = LineIndex::new(bytes);
    let record_line = |record: &::csv::ByteRecord| {
        let byte = record.position().map_or(0, |p| p.byte());
        lines.record_line(usize::try_from(byte).unwrap_or(usize::MAX))
    };
    let mut reader =
        ::csv::ReaderBuilder::new().delimiter(delimiter).has_headers(false).flexible(true).from_reader(bytes);
    let mut record = ::csv::ByteRecord::new();
    let malformed = |source: ::csv::Error| {
        let byte = source.position().map_or(0, |p| p.byte());
        let line = lines.record_line(usize::try_from(byte).unwrap_or(usize::MAX));
        DataError::MalformedCsv { path: path.to_path_buf(), line, source }
    };
    let header = read_header(&mut reader, &mut record, path, &record_line, &malformed)?;
    let shape = Shape::of(&header, opts, path)?;
    rows.implicit = Some((matches!(shape, Shape::Pairs { prompt: None, .. }), 1));
    loop {
        match reader.read_byte_record(&mut record) {
            Ok(false) => break,
            Ok(true) => {}
            Err(e) => {
                let err = malformed(e);
                let line = match &err {
                    DataError::MalformedCsv { line, .. } => *line,
                    _ => 0,
                };
                // A CSV syntax error (only invalid UTF-8 in strict readers) leaves the reader able
                // to continue with the next record.
                rows.bad(line, err)?;
                continue;
            }
        }
        let line = record_line(&record);
        // A field too many (an unquoted comma in a completion) would shift the row's text.
        let row = match record.len() > header.len() {
            true => Err(RowProblem::ExtraFields { found: record.len(), columns: header.len() }),
            false => shape.row(&record, line, cols),
        };
        // A quote never closed runs to the end of the file, which the reader takes as one field:
        // that, not the fields it swallowed, is what a bad row's error names.
        let span = |p: Option<&::csv::Position>| usize::try_from(p.map_or(0, |p| p.byte())).unwrap_or(usize::MAX);
        let text = bytes.get(span(record.position())..span(Some(reader.position()))).unwrap_or_default();
        let open_quote = text.iter().filter(|&&b| b == b'"').count() % 2 == 1;
        let row = row.map_err(|problem| if open_quote { RowProblem::UnterminatedQuote } else { problem });
        rows.push(line, row)?;
    }
    Ok(())
}

/// The cells pandas' `read_csv` reads as missing by default (`pandas._libs.parsers.STR_NA_VALUES`,
/// pandas 3.1; quoted or not, matched exactly): `datasets` loads CSV through it, so TRL is handed
/// `None` for them and fails. Such a cell is a bad row here, where taking its text would train on
/// rows TRL cannot.
const PANDAS_NA: [&str; 19] = [
    "", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN", "<NA>", "N/A", "NA",
    "NULL", "NaN", "None", "n/a", "nan", "null",
];

/// Which columns a CSV file's rows are read from.
enum Shape {
    Pairs {
        chosen: usize,
        rejected: usize,
        prompt: Option<usize>,
    },
    Unpaired {
        prompt: usize,
        completion: usize,
        label: usize,
    },
    /// Rows of the other kind than the loss reads: each is this problem.
    Refused(RowProblem),
}

impl Shape {
    /// The columns `header` names for the rows `opts` reads, or the one missing.
    fn of(header: &[String], opts: &LoadOptions, path: &Path) -> Result<Self, DataError> {
        let cols = &opts.columns;
        let find = |name: &str| header.iter().position(|h| h == name);
        let missing = |column: &str| DataError::MissingColumn {
            path: path.to_path_buf(),
            column: column.to_string(),
            found: if header.is_empty() {
                "no columns".to_string()
            } else {
                header.iter().map(|h| format!("`{h}`")).collect::<Vec<_>>().join(", ")
            },
        };
        Ok(match opts.rows.reading(cols, |name| find(name).is_some()) {
            Reading::Unpaired => Shape::Unpaired {
                prompt: find(&cols.prompt).ok_or_else(|| missing(&cols.prompt))?,
                completion: find(COMPLETION).ok_or_else(|| missing(COMPLETION))?,
                label: find(LABEL).ok_or_else(|| missing(LABEL))?,
            },
            Reading::Refused(problem) => Shape::Refused(problem),
            Reading::Pairs => Shape::Pairs {
                chosen: find(&cols.chosen).ok_or_else(|| missing(&cols.chosen))?,
                rejected: find(&cols.rejected).ok_or_else(|| missing(&cols.rejected))?,
                prompt: find(&cols.prompt),
            },
        })
    }

    /// The row of `record`, which starts on `line`.
    fn row(&self, record: &::csv::ByteRecord, line: usize, cols: &Columns) -> Result<PreferenceRow, RowProblem> {
        let field = |at: usize, name: &str| -> Result<Text, RowProblem> {
            let bytes = record.get(at).ok_or_else(|| RowProblem::MissingField { field: name.to_string() })?;
            let s = std::str::from_utf8(bytes).map_err(|_| RowProblem::InvalidUtf8Field { field: name.to_string() })?;
            if PANDAS_NA.contains(&s) {
                let found = if s.is_empty() { "empty".to_owned() } else { format!("`{s}`") };
                return Err(RowProblem::CsvMissing { field: name.to_string(), found });
            }
            Ok(Text::Plain(s.to_string()))
        };
        match self {
            Shape::Pairs { chosen, rejected, prompt } => {
                let prompt = match prompt {
                    Some(at) => Some(field(*at, &cols.prompt)?),
                    None => None,
                };
                build_row(line, prompt, field(*chosen, &cols.chosen)?, field(*rejected, &cols.rejected)?, cols)
            }
            Shape::Unpaired { prompt, completion, label } => {
                let Text::Plain(value) = field(*label, LABEL)? else { unreachable!("CSV fields are text") };
                // pandas (under `datasets`) reads these spellings as booleans, and 0/1 as
                // integers, which TRL takes as labels too.
                let label = match value.trim() {
                    "true" | "True" | "TRUE" | "1" => true,
                    "false" | "False" | "FALSE" | "0" => false,
                    other => {
                        let found = format!("`{other}`");
                        return Err(RowProblem::NotBoolean { field: LABEL.to_owned(), found });
                    }
                };
                build_unpaired_row(line, field(*prompt, &cols.prompt)?, field(*completion, COMPLETION)?, label, cols)
            }
            Shape::Refused(problem) => Err(problem.clone()),
        }
    }
}

/// The header row's column names.
fn read_header(
    reader: &mut ::csv::Reader<&[u8]>,
    record: &mut ::csv::ByteRecord,
    path: &Path,
    record_line: &dyn Fn(&::csv::ByteRecord) -> usize,
    malformed: &dyn Fn(::csv::Error) -> DataError,
) -> Result<Vec<String>, DataError> {
    let header_line = match reader.read_byte_record(record) {
        Ok(false) => return Err(DataError::Empty { path: path.to_path_buf() }),
        Ok(true) => record_line(record),
        Err(e) => return Err(malformed(e)),
    };
    let utf8 = |field| std::str::from_utf8(field).map(str::to_string);
    record.iter().map(utf8).collect::<Result<_, _>>().map_err(|_| DataError::BadRow {
        path: path.to_path_buf(),
        line: header_line,
        problem: RowProblem::InvalidUtf8Field { field: "(header)".into() },
    })
}
