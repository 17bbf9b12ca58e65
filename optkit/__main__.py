from optkit.cli.main import main

main()
