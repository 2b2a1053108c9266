from dspark_hub.cli.main import main

main()
