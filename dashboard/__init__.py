"""memtrack's Streamlit dashboard: `memtrack dashboard`, or
`streamlit run dashboard/app.py -- --db PATH [--config PATH]`."""
