"""Jobs: model uploads, job creation, the measurement queue, results, the job driver."""
