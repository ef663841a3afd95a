//! Arrow record batches as rows: Parquet's, and the `.arrow` files `datasets` writes. String
//! columns, or conversations stored as `list<struct<role: string, content: string, ...>>` (a
//! message's other fields passed to the chat template as their JSON); dictionary-encoded cells
//! (pandas' categoricals), at any depth, read as their values. Only the columns a row needs are decoded, one batch
//! at a time. Rows are numbered from 0, as `datasets` indexes them.

use arrow_array::cast::AsArray;
use arrow_array::{Array, ArrayRef, OffsetSizeTrait, RecordBatch, StructArray};
use arrow_schema::{DataType, Fields};
use serde_json::{Map, Value};

use super::{COMPLETION, LABEL, LoadOptions, Reading, Rows, TEMPLATE_FIELDS};
use crate::error::{DataError, RowProblem};

/// The columns of a file's schema that its rows are read from.
pub(super) struct Selected {
    /// Their indices in the file's schema (a reader's projection).
    pub projection: Vec<usize>,
    /// The names a row may hold, in the order the row's object is built.
    names: Vec<String>,
}

/// The columns to read from a file whose schema has `fields`: the text columns the loss reads
/// (an error names one that is missing or of a type no row holds), the prompt, KTO's label and
/// the chat template's arguments when present.
pub(super) fn select(fields: &Fields, opts: &LoadOptions, rows: &mut Rows) -> Result<Selected, DataError> {
    let path = &rows.path;
    let index = |name: &str| fields.iter().position(|f| f.name() == name);
    let missing = |column: &str| DataError::MissingColumn {
        path: path.to_path_buf(),
        column: column.to_owned(),
        found: fields.iter().map(|f| format!("`{}`", f.name())).collect::<Vec<_>>().join(", "),
    };
    let cols = &opts.columns;
    // The columns of the rows the file holds: each row of the kind the loss does not read is
    // refused by `push_value`, which needs those columns to say so.
    let unpaired = index(COMPLETION).is_some() && index(LABEL).is_some();
    let kto = match opts.rows.reading(cols, |name| index(name).is_some()) {
        Reading::Unpaired | Reading::Refused(RowProblem::UnpairedForPairs { .. }) => true,
        Reading::Pairs | Reading::Refused(_) => false,
    };
    let texts: Vec<&str> = if kto { vec![COMPLETION] } else { vec![&cols.chosen, &cols.rejected] };
    let mut wanted = Vec::new();
    for name in &texts {
        wanted.push(index(name).ok_or_else(|| missing(name))?);
    }
    let prompt = index(&cols.prompt);
    if kto && prompt.is_none() && unpaired {
        return Err(missing(&cols.prompt));
    }
    for &i in wanted.iter().chain(&prompt) {
        let field = &fields[i];
        if !readable(field.data_type()) {
            return Err(DataError::ColumnType {
                path: path.to_path_buf(),
                column: field.name().clone(),
                found: field.data_type().to_string(),
            });
        }
    }
    let label = if kto { index(LABEL) } else { None };
    // A conversational row's arguments for the chat template (see `TEMPLATE_FIELDS`).
    let template = TEMPLATE_FIELDS.iter().filter_map(|f| index(f));
    let projection = wanted.iter().copied().chain(prompt).chain(label).chain(template).collect();
    // TRL extracts the prompt when the dataset has no prompt column.
    rows.implicit = Some((prompt.is_none(), 0));
    let names = match kto {
        true => vec![cols.prompt.as_str(), COMPLETION, LABEL, &cols.chosen, &cols.rejected],
        false => vec![cols.prompt.as_str(), &cols.chosen, &cols.rejected],
    };
    let names = names.into_iter().chain(TEMPLATE_FIELDS).map(str::to_owned).collect();
    Ok(Selected { projection, names })
}

/// Hands each row of `batch` to `rows` as the JSON object a `.jsonl` row would be, numbering them
/// on from `row`.
pub(super) fn push_batch(
    batch: &RecordBatch,
    selected: &Selected,
    rows: &mut Rows,
    row: &mut usize,
) -> Result<(), DataError> {
    let columns: Vec<(&str, &ArrayRef)> =
        selected.names.iter().filter_map(|name| Some((name.as_str(), batch.column_by_name(name)?))).collect();
    for i in 0..batch.num_rows() {
        let mut object = Map::new();
        for (name, column) in &columns {
            let value = match TEMPLATE_FIELDS.contains(name) {
                true => json(column.as_ref(), i),
                false => cell(column, i),
            };
            object.insert((*name).to_owned(), value);
        }
        rows.push_value(*row, &Value::Object(object))?;
        *row += 1;
    }
    Ok(())
}

/// A string column, or a list column (of `{role, content}` structs, checked row by row), plain
/// or dictionary-encoded.
fn readable(t: &DataType) -> bool {
    match t {
        DataType::Dictionary(_, values) => readable(values),
        t => matches!(
            t,
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::List(_) | DataType::LargeList(_)
        ),
    }
}

/// One cell as the JSON a `.jsonl` row would hold: a string, a list of `{role, content}`
/// objects, or null.
fn cell(column: &ArrayRef, i: usize) -> Value {
    if column.is_null(i) {
        return Value::Null;
    }
    if let Some((values, key)) = entry(column.as_ref(), i) {
        return cell(values, key);
    }
    match column.data_type() {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => text(column.as_ref(), i),
        DataType::List(_) => messages(column.as_list::<i32>(), i),
        DataType::LargeList(_) => messages(column.as_list::<i64>(), i),
        // KTO's label: a boolean, or an integer (0/1 pass the row check); any other column type
        // reaches the row check as a string.
        DataType::Boolean => Value::Bool(column.as_boolean().value(i)),
        t if t.is_integer() => integer(column.as_ref(), i).map_or(Value::Null, Value::from),
        _ => Value::String(String::new()),
    }
}

/// An integer cell of any of Arrow's integer types.
fn integer(column: &dyn Array, i: usize) -> Option<i64> {
    use arrow_array::types::{
        Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
    };
    macro_rules! try_types {
        ($($t:ty),*) => {$(
            if let Some(a) = column.as_primitive_opt::<$t>() {
                // A u64 past i64's range is no label either way.
                return Some(i64::try_from(a.value(i)).unwrap_or(i64::MAX));
            }
        )*};
    }
    try_types!(Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type, UInt16Type, UInt32Type, UInt64Type);
    None
}

/// Where `column` is dictionary-encoded (a categorical anywhere in a row, a message's field
/// too): its values and the index of cell `i`'s value among them.
fn entry(column: &dyn Array, i: usize) -> Option<(&ArrayRef, usize)> {
    let dict = column.as_any_dictionary_opt()?;
    let key = integer(dict.keys(), i).and_then(|k| usize::try_from(k).ok())?;
    (key < dict.values().len()).then(|| (dict.values(), key))
}

/// A string cell of any of Arrow's string layouts (null where the cell is not a string).
fn text(column: &dyn Array, i: usize) -> Value {
    if column.is_null(i) {
        return Value::Null;
    }
    if let Some((values, key)) = entry(column, i) {
        return text(values.as_ref(), key);
    }
    let s = if let Some(a) = column.as_string_opt::<i32>() {
        a.value(i)
    } else if let Some(a) = column.as_string_opt::<i64>() {
        a.value(i)
    } else if let Some(a) = column.as_string_view_opt() {
        a.value(i)
    } else {
        return Value::Null;
    };
    Value::String(s.to_owned())
}

/// A list cell: its `role` and `content` fields per element, when the elements are structs.
fn messages<O: OffsetSizeTrait>(list: &arrow_array::GenericListArray<O>, i: usize) -> Value {
    let items = list.value(i);
    let Some(structs) = items.as_struct_opt() else {
        // A list of strings (or numbers): the row check reports a list of non-messages.
        return Value::Array((0..items.len()).map(|j| text(items.as_ref(), j)).collect());
    };
    Value::Array((0..structs.len()).map(|j| message(structs, j)).collect())
}

/// A message struct: `role` and `content` as strings (another type is the row check's to report),
/// and its other fields (`reasoning_content`, `tool_calls`, ...) as the JSON they hold.
fn message(structs: &StructArray, j: usize) -> Value {
    if structs.is_null(j) {
        return Value::Null;
    }
    let mut object = Map::new();
    for (field, column) in structs.fields().iter().zip(structs.columns()) {
        let value = match field.name().as_str() {
            "role" | "content" => text(column.as_ref(), j),
            _ => json(column.as_ref(), j),
        };
        object.insert(field.name().clone(), value);
    }
    Value::Object(object)
}

/// Any cell as JSON, as `datasets` hands it to Python: strings, numbers, booleans, lists and
/// structs (nested), null for a null cell or a type no message field holds.
fn json(column: &dyn Array, i: usize) -> Value {
    if column.is_null(i) {
        return Value::Null;
    }
    if let Some((values, key)) = entry(column, i) {
        return json(values.as_ref(), key);
    }
    match column.data_type() {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => text(column, i),
        DataType::Boolean => Value::Bool(column.as_boolean().value(i)),
        t if t.is_integer() => integer(column, i).map_or(Value::Null, Value::from),
        DataType::Float32 => column.as_primitive::<arrow_array::types::Float32Type>().value(i).into(),
        DataType::Float64 => column.as_primitive::<arrow_array::types::Float64Type>().value(i).into(),
        DataType::List(_) => list(column.as_list::<i32>(), i),
        DataType::LargeList(_) => list(column.as_list::<i64>(), i),
        DataType::Struct(_) => {
            let structs = column.as_struct();
            let fields = structs.fields().iter().zip(structs.columns());
            Value::Object(fields.map(|(f, c)| (f.name().clone(), json(c.as_ref(), i))).collect())
        }
        _ => Value::Null,
    }
}

fn list<O: OffsetSizeTrait>(list: &arrow_array::GenericListArray<O>, i: usize) -> Value {
    let items = list.value(i);
    Value::Array((0..items.len()).map(|j| json(items.as_ref(), j)).collect())
}
