"""The object store both sides use: its interface (`interface`), a local directory (`local`), any S3 API
(`s3`, boto3 loaded only when used), the split between the job's and the orchestrator's side (`sides`), and
the choice of a store from the environment or a spec (`factory`). No torch and no Airflow in this package."""
